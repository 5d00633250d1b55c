"""A real console server over a real SQLite file, and Debian's Chromium driven by Playwright.

These tests run in their own pytest invocation (``pytest -m browser tests/browser``, see
``.ci/run``): Playwright's sync API runs its own event loop, which must not share a process
with the async tests. No browser is downloaded: Chromium comes from the system package.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import socket
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.support import console_flows as cf
from tests.support.proc import Child

ROOT = Path(__file__).resolve().parents[2]
CHROMIUM = os.environ.get("LOOM_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
SHOTS = Path(os.environ.get("LOOM_SCREENSHOT_DIR", ROOT / "build" / "screenshots"))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Console:
    url: str
    db: Path
    process: Child


@pytest.fixture
def console(tmp_path: Path) -> Iterator[Console]:
    db = tmp_path / "console.db"
    # Playwright's sync API owns this thread's event loop: populate from another thread.
    with ThreadPoolExecutor(1) as pool:
        pool.submit(asyncio.run, cf.populate(str(db))).result()
    port = _free_port()
    # From tmp_path: whatever the console writes beside it stays in the test's directory.
    process = Child(
        "loom.cli", "console",
        "--db", db,
        "--app", "tests.support.console_flows:FLOWS",
        "--port", str(port),
        env={}, drop=("LOOM_CONSOLE_TOKEN",), log=tmp_path / "console.log", cwd=tmp_path,
    )  # fmt: skip
    try:
        url = process.serving_sync(f"http://127.0.0.1:{port}", health="/executions", timeout=30)
        yield Console(url, db, process)
    finally:
        process.signal(signal.SIGTERM)
        process.finish(timeout=10)


@pytest.fixture(scope="session")
def browser() -> Iterator[object]:
    if not Path(CHROMIUM).exists() and not shutil.which("chromium"):
        pytest.fail(f"no Chromium at {CHROMIUM}: apt-get install -y chromium")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        chromium = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_FLAGS)
        try:
            yield chromium
        finally:
            chromium.close()


@pytest.fixture
def page(browser: object) -> Iterator[object]:
    context = browser.new_context(viewport={"width": 1280, "height": 900})  # type: ignore[attr-defined]
    pg = context.new_page()
    pg.set_default_timeout(15_000)
    try:
        yield pg
    finally:
        context.close()


def shot(page: object, name: str) -> Path:
    SHOTS.mkdir(parents=True, exist_ok=True)
    path = SHOTS / f"{name}.png"
    page.screenshot(path=str(path), full_page=True)  # type: ignore[attr-defined]
    return path
