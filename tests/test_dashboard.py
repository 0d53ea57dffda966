"""The web page at `/`: rendered HTML, the rank form, the plots, and a real headless browser.

The browser test drives Debian's Chromium with Playwright (no browser download). `.ci/run`
installs `chromium` when apt is available; without a browser the test is skipped and says why.
With LEAP_UPDATE_SCREENSHOTS=1 it refreshes the README's screenshots in docs/img/.
"""

from __future__ import annotations

import html
import json
import os
import shutil
import tempfile
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from conftest import SMALL_AS_OF
from leap.config import Workspace
from leap.data.schema import JOB_COLUMNS
from leap.data.store import Store
from leap.model.artifact import Registry
from leap.rank.decisions import DecisionLog, decisions_path
from leap.rank.policy import FLAGS
from leap.rank.ranker import Ranker
from leap.serve.app import create_app
from leap.serve.monitor import MonitorCollector
from test_serve import serving

IMG = Path(__file__).resolve().parent.parent / "docs" / "img"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                 "--no-first-run", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync"]


def _live_app(ws: Workspace, n: int = 40) -> tuple[Any, DecisionLog, list[dict[str, Any]]]:
    """An app whose decision log holds rankings of n launches of the held-out day."""
    ranker = Ranker(Registry(ws.models_dir), background_reload=False)
    log = DecisionLog(decisions_path(ws.home), flush_interval_s=0.05)
    with Store(ws.store_path, read_only=True) as store:
        rows = store.attempts(SMALL_AS_OF, SMALL_AS_OF + timedelta(days=1)).to_pylist()[:n]
    jobs = [{**{k: a[k] for k in JOB_COLUMNS if a.get(k) is not None},
             "attempt_id": a["attempt_id"], "submitted_at": a["submitted_at"].isoformat()}
            for a in rows]
    for job in jobs:
        log.record(job, None, ranker.rank(job))
    assert log.flush(20)
    monitor = MonitorCollector(ws.store_path, decisions_path(ws.home), ttl_s=0.0)
    return create_app(ranker, decisions=log, monitor=monitor), log, jobs


def test_page_shows_model_live_figures_and_ranks_a_job(fresh_copy: Workspace) -> None:
    app, _, jobs = _live_app(fresh_copy)
    with TestClient(app) as client:
        r = client.get("/")
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
        page = r.text
        version = Registry(fresh_copy.models_dir).latest_version()
        assert f"<b>{version}</b>" in page and 'id="heldout-accuracy"' in page
        assert 'id="live-coverage"' in page and 'id="nightly"' in page
        assert "<script" not in page  # plain HTML, no JavaScript
        job = {k: v for k, v in jobs[0].items() if k not in ("attempt_id", "submitted_at")}
        r = client.get("/", params={"job": json.dumps(job), "candidates": "H100-SXM, L4,T4"})
        assert r.status_code == 200 and 'id="ranking"' in r.text
        ranked = Ranker(Registry(fresh_copy.models_dir)).rank(job, ["H100-SXM", "L4", "T4"])
        first = ranked.ranking[0].hardware
        assert f"<td>1</td><td>{first}</td>" in r.text
        assert any(entry.flags for entry in ranked.ranking)
        for entry in ranked.ranking:  # each flag in words, as the CLI's legend says it
            for flag in entry.flags:
                assert html.escape(FLAGS[flag]) in r.text
                assert "_" not in flag or flag not in r.text
        r = client.get("/", params={"job": "{not json"})
        assert r.status_code == 422 and "not valid JSON" in r.text
        r = client.get("/", params={"job": json.dumps({**job, "trainer_count": 0})})
        assert r.status_code == 422 and "trainer_count" in r.text
        r = client.get("/", params={"job": json.dumps(job), "candidates": "H10O"})
        assert r.status_code == 422 and "did you mean" in r.text
        for path in ("/dashboard/nightly.png", "/dashboard/live.png"):
            r = client.get(path)
            assert r.status_code == 200 and r.content.startswith(b"\x89PNG")


def test_page_without_a_model_says_so(tmp_path: Path) -> None:
    ranker = Ranker(Registry(tmp_path / "models"), background_reload=False)
    with TestClient(create_app(ranker)) as client:
        r = client.get("/")
        assert r.status_code == 200 and 'id="no-model"' in r.text
        assert 'id="live-empty"' in r.text


def _chromium() -> str | None:
    for cand in ("/usr/lib/chromium/chromium", shutil.which("chromium"),
                 shutil.which("chromium-browser")):
        if cand and Path(cand).is_file() and os.access(cand, os.X_OK):
            return cand
    return None


def test_the_page_in_a_real_headless_browser(fresh_copy: Workspace, tmp_path: Path) -> None:
    try:
        from playwright.sync_api import Error as PlaywrightError
        from playwright.sync_api import sync_playwright
    except ImportError:
        pytest.skip("browser test skipped: the python package 'playwright' is not installed "
                    "(pip install -e '.[dev]')")
    browser_path = _chromium()
    if browser_path is None:
        pytest.skip("browser test skipped: no Chromium found (apt-get install chromium; "
                    ".ci/run does it where apt is available)")
    app, _, jobs = _live_app(fresh_copy)
    shots = IMG if os.environ.get("LEAP_UPDATE_SCREENSHOTS") == "1" else tmp_path
    profile = tempfile.mkdtemp(prefix="leap-chromium-")
    with serving(app) as base, sync_playwright() as pw:
        try:
            browser = pw.chromium.launch_persistent_context(
                profile, executable_path=browser_path, headless=True, args=CHROMIUM_ARGS,
                viewport={"width": 1200, "height": 900})
        except PlaywrightError as exc:
            pytest.skip(f"browser test skipped: Chromium at {browser_path} did not start "
                        f"({str(exc).splitlines()[0]})")
        try:
            page = browser.new_page()
            page.goto(base + "/", wait_until="load")
            assert page.title() == "leap: dashboard"
            version = Registry(fresh_copy.models_dir).latest_version()
            assert page.inner_text("#model-version b") == version
            assert page.inner_text("#live-coverage b").endswith("%")
            for img in ("#nightly-plot", "#live-plot"):
                assert page.eval_on_selector(img, "e => e.complete && e.naturalWidth") > 0
            page.screenshot(path=str(shots / "dashboard.png"), full_page=False)
            job = {k: v for k, v in jobs[1].items() if k not in ("attempt_id", "submitted_at")}
            page.fill("#job", json.dumps(job, indent=2))
            page.fill("#candidates", "H100-SXM,A100-SXM4-80GB,L40S,L4,T4")
            page.click("#rank-button")
            page.wait_for_selector("#ranking")
            rows = page.query_selector_all("#ranking tbody tr")
            assert 1 <= len(rows) <= 5
            first = rows[0].query_selector_all("td")[1].inner_text()
            want = Ranker(Registry(fresh_copy.models_dir)).rank(
                job, ["H100-SXM", "A100-SXM4-80GB", "L40S", "L4", "T4"]).ranking[0].hardware
            assert first == want
            page.locator("#rank").scroll_into_view_if_needed()
            page.screenshot(path=str(shots / "dashboard_rank.png"), full_page=False)
        finally:
            browser.close()
            shutil.rmtree(profile, ignore_errors=True)
    assert (shots / "dashboard.png").stat().st_size > 10_000
