"""CLI: `leap describe-model` (the architecture summary of a model's config.json)."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.table import Table

from leap.cli import app, console, guarded, print_json


@app.command("describe-model", epilog="Example: leap describe-model config.json --seq-len 2048 "
             "--json   (then pass the file to `leap rank --model-config` or put it in a job as "
             "\"model_config\")")
@guarded
def describe_model_cmd(
    config: Path = typer.Argument(..., help="A Hugging Face style config.json (llama, mistral, "
                                  "mixtral, qwen2, gemma, gpt2, gpt_neox, bert, roberta, vit) "
                                  "or leap's DLRM format (see leap.arch)."),
    seq_len: int = typer.Option(None, "--seq-len", min=1, help="Tokens per sample for the "
                                "FLOPs (default: the config's context length)."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """Work out a model's parameters, FLOPs per sample, layers and width from its definition."""
    from leap.arch import describe_model, read_model_config

    summary = describe_model(read_model_config(config), seq_len=seq_len, origin=str(config))
    out = {**summary.columns(), "active_params": summary.active_params,
           "model_type": summary.model_type, "model_category": summary.model_category}
    if as_json:
        print_json(out)
        return
    t = Table(title=f"{config.name}: {summary.model_type} ({summary.model_category})")
    t.add_column("column")
    t.add_column("value", justify="right")
    for name, value in out.items():
        if isinstance(value, float):
            text = f"{value:,.0f}" if value < 1e15 else f"{value:.4g}"
        else:
            text = "—" if value is None else str(value)
        t.add_row(name, text)
    console.print(t)
