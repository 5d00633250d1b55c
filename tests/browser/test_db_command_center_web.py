"""The DB command center's web page in a real headless Chromium: a request typed into the
page is planned and answered live (server-sent events); a write shows its row count and is
approved with the page's button (the rows change), another is rejected (nothing changes), a
third is cancelled with the page's Cancel button while it waits (its execution is cancelled,
nothing is written), and long SQL wraps inside its card instead of being cut off."""

from __future__ import annotations

import signal
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.browser.conftest import shot
from tests.support.proc import Child

pytestmark = pytest.mark.browser


@pytest.fixture(params=["local", "http"])
def web(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[str, Path, str]]:
    url_file = tmp_path / "url"
    env = {
        "LOOM_EXAMPLE_LEDGER": str(tmp_path / "effects.db"),
        "LOOM_EXAMPLE_SAMPLE_DB": str(tmp_path / "shop.db"),
        "LOOM_EXAMPLE_STORE": f"sqlite:{tmp_path / 'loom.db'}",
    }
    proc = Child(
        "examples.db_command_center_web", "--placement", request.param,
        "--workdir", tmp_path, "--port-file", url_file,
        env=env, log=tmp_path / "web.log",
    )  # fmt: skip
    try:
        url = proc.serving_sync(url_file, health=None, timeout=60)
        yield url, tmp_path / "shop.db", request.param
    finally:
        proc.signal(signal.SIGTERM)
        proc.finish(timeout=20)


def _count(db: Path, sql: str) -> int:
    with sqlite3.connect(db) as conn:
        return int(conn.execute(sql).fetchone()[0])


def _ask(page: Any, text: str) -> Any:
    page.fill("#text", text)
    page.click("form#ask button")
    card = page.locator(".card", has_text=text).first
    card.wait_for()
    return card


def test_ask_approve_and_reject_in_the_browser(web: tuple[str, Path, str], page: Any) -> None:
    url, db, _ = web
    tmp = db.parent
    page.goto(url + "/")
    why = _ask(page, "Why did orders drop yesterday?")
    why.locator(".answer").wait_for()
    assert "26 of 30 card payments failed" in why.locator(".answer").text_content()
    assert why.locator("table").count() == 2  # both query results rendered
    assert "completed" in why.locator(".status").text_content()

    archive = _ask(page, "Archive orders older than 2 years")
    archive.locator(".pending").wait_for()
    assert "This write changes 1460 row(s)." in archive.locator(".pending").text_content()
    assert _count(db, "SELECT COUNT(*) FROM orders WHERE status = 'archived'") == 0

    archive.locator("input[name=by]").fill("ops-lead")
    archive.locator("button[data-action=approve]").click()
    archive.locator(".answer").wait_for()
    assert "1460 row(s) changed" in archive.locator(".answer").text_content()
    assert _count(db, "SELECT COUNT(*) FROM orders WHERE status = 'archived'") == 1460

    cleanup = _ask(page, "Delete all cancelled orders")
    cleanup.locator(".pending").wait_for()
    cleanup.locator("button[data-action=reject]").click()  # no name: refused, nothing recorded
    page.wait_for_function(
        "document.querySelector('.card .error') && "
        "document.querySelector('.card .error').textContent.includes('by')"
    )
    cleanup.locator("input[name=by]").fill("ops-lead")
    cleanup.locator("input[name=reason]").fill("keep for audit")
    cleanup.locator("button[data-action=reject]").click()
    cleanup.locator(".answer").wait_for()
    assert "rejected by ops-lead" in cleanup.locator(".answer").text_content()
    assert _count(db, "SELECT COUNT(*) FROM orders WHERE status = 'cancelled'") == 88

    regions = _ask(page, "Merge the east region into central")
    regions.locator(".pending").wait_for()
    assert "This write changes 10 row(s)." in regions.locator(".pending").text_content()
    shot(page, f"command-center-pending-{web[2]}")
    regions.locator("input[name=reason]").fill("asked by mistake")
    regions.locator("button[data-action=cancel]").click()
    regions.locator(".status.cancelled").wait_for()
    assert regions.locator(".pending").count() == 0  # no buttons left on a cancelled request
    assert "cancelled: asked by mistake" in regions.locator(".cancel-note").text_content()
    assert _count(db, "SELECT COUNT(*) FROM customers WHERE region = 'east'") == 10
    rid = regions.get_attribute("data-id")
    with httpx.Client() as client:  # the execution itself is cancelled
        view = client.get(f"{url}/api/requests/{rid}").json()
        assert (view["status"], view["cancel_reason"]) == ("cancelled", "asked by mistake")
        late = client.post(f"{url}/api/requests/{rid}/approve", json={"by": "ops-lead"})
        assert late.status_code == 409  # nothing waits any more: a late approval is refused
    assert _count(db, "SELECT COUNT(*) FROM customers WHERE region = 'east'") == 10
    with sqlite3.connect(tmp / "effects.db") as conn:
        assert conn.execute(
            "SELECT name, COUNT(*) FROM effects WHERE execution_id = ? GROUP BY name ORDER BY name",
            (rid,),
        ).fetchall() == [("model:planner", 1), ("preview", 1)]

    # Every SQL statement fits its card (wrapped, not cut off at the right edge).
    cut = page.evaluate(
        "[...document.querySelectorAll('pre')]"
        ".filter((p) => p.scrollWidth > p.clientWidth + 1).map((p) => p.textContent)"
    )
    assert cut == []
    shot(page, f"command-center-done-{web[2]}")
