"""Imports point one way, down the data flow (docs/style.md): a lower layer never imports a
higher one, and CLI modules never reach into each other's private names.

The graph is read with :mod:`ast` from the source, so an import inside a function counts as
much as one at the top of a module (a lazy import is still a dependency).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src" / "leap"

#: Layer of each top-level module or package of ``leap``; a module may import its own layer
#: and the ones below. ``eval`` drives ``sim`` (the oracle), never the other way round.
LAYERS: dict[str, int] = {
    "errors": 0, "config": 0, "metrics": 0, "records": 0, "catalog": 0, "arch": 0, "resources": 0,
    "threads": 0, "memory": 0, "cache": 0,
    "data": 1,
    "features": 2, "datasets": 2,
    "model": 3,
    "rank": 4,
    "serve": 5,
    "sim": 6,
    "eval": 7,
    "cli": 8, "__main__": 8,
}


def _layer_of(rel: Path) -> str:
    return rel.parts[0] if len(rel.parts) > 1 else rel.stem


def _imports(path: Path) -> list[tuple[str, list[str]]]:
    """``(module, names)`` for every absolute ``leap`` import in ``path``."""
    out: list[tuple[str, list[str]]] = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            out += [(a.name, []) for a in node.names if a.name.startswith("leap.")]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module \
                and (node.module == "leap" or node.module.startswith("leap.")):
            out.append((node.module, [a.name for a in node.names]))
    return out


def _modules() -> list[Path]:
    return sorted(p for p in SRC.rglob("*.py") if p.relative_to(SRC) != Path("__init__.py"))


def _upward() -> set[tuple[str, str]]:
    found: set[tuple[str, str]] = set()
    for path in _modules():
        rel = path.relative_to(SRC)
        here = LAYERS[_layer_of(rel)]
        for module, _ in _imports(path):
            parts = module.split(".")
            if len(parts) < 2:
                continue
            if LAYERS[parts[1]] > here:
                found.add((rel.as_posix(), module))
    return found


def test_every_module_has_a_layer() -> None:
    missing = sorted({_layer_of(p.relative_to(SRC)) for p in _modules()} - set(LAYERS))
    assert not missing, f"add these to LAYERS: {missing}"


def test_no_lower_layer_imports_a_higher_one() -> None:
    upward = sorted(_upward())
    assert not upward, "upward imports (module, imported): " + ", ".join(map(str, upward))


def test_cli_modules_share_only_public_names() -> None:
    private = []
    for path in sorted((SRC / "cli").glob("*.py")):
        for module, names in _imports(path):
            if module.startswith("leap.cli"):
                private += [f"{path.name}: {module}.{n}" for n in names if n.startswith("_")]
    assert not private, f"CLI modules import each other's privates: {private}"


@pytest.mark.parametrize("src, dst, expected", [
    ("data/store.py", "leap.features.history", True),
    ("eval/backtest.py", "leap.sim.fleet", False),
    ("sim/run.py", "leap.eval.report", True),
    ("cli/demo.py", "leap.eval.report", False),
])
def test_the_rule_itself(src: str, dst: str, expected: bool) -> None:
    # The check the tests above apply, on made-up edges: a higher layer is refused.
    assert (LAYERS[dst.split(".")[1]] > LAYERS[_layer_of(Path(src))]) is expected


def test_docstring_examples_run() -> None:
    # The suite runs every docstring example (--doctest-modules); a ">>> #" line would pass
    # while checking nothing, so none may appear.
    found = sorted(p.relative_to(SRC).as_posix() for p in _modules()
                   if any(line.lstrip().startswith(">>> #")
                           for line in p.read_text(encoding="utf-8").splitlines()))
    assert not found, f"commented-out examples in {found}"


def _raised_texts(path: Path) -> list[tuple[int, str]]:
    """The string pieces of every ``raise`` in ``path`` (f-string parts included)."""
    out = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Raise) and node.exc is not None:
            out += [(c.lineno, c.value) for c in ast.walk(node.exc)
                    if isinstance(c, ast.Constant) and isinstance(c.value, str)]
    return out


def test_library_errors_name_parameters_not_cli_flags() -> None:
    """A Python user is never told about a flag they never used: library errors name the
    parameter (``{as_of}``, a :class:`~leap.errors.ParamError`) and the CLI spells it."""
    import re

    flag = re.compile(r"(?<![\w-])--[a-z][a-z-]+")
    found = [f"{p.relative_to(SRC)}:{line}: {text.strip()}"
             for p in _modules() if _layer_of(p.relative_to(SRC)) not in ("cli", "__main__")
             for line, text in _raised_texts(p) if flag.search(text)]
    assert not found, "library errors naming CLI flags:\n" + "\n".join(found)
