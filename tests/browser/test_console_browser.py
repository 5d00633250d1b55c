"""The console in a real headless Chromium: list, slider, live timeline, approve, refusals."""

from __future__ import annotations

import json
import subprocess
from typing import Any

import pytest

from tests.browser.conftest import Console, shot
from tests.support.console_flows import HOSTILE
from tests.support.proc import run_child

pytestmark = pytest.mark.browser


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return run_child("loom.cli", *args, timeout=60)


def test_find_a_suspended_execution_and_drag_the_slider(console: Console, page: Any) -> None:
    page.goto(console.url + "/executions")
    shot(page, "executions")
    page.select_option("select[name=status]", "suspended")
    page.click("form.filters button")
    rows = page.locator("table.list tbody tr")
    assert rows.count() == 3
    assert "review-done" not in page.content()
    page.click("text=review-1")
    page.wait_for_url("**/executions/review-1")
    head = page.locator("[data-execution]")
    assert head.get_attribute("data-status-value") == "suspended"
    # Drag the slider to the start: the folded state shown is the one at sequence 0.
    slider = page.locator("input[type=range]")
    box = slider.bounding_box()
    page.mouse.click(box["x"] + 2, box["y"] + box["height"] / 2)
    page.wait_for_function(
        "document.querySelector('[data-slider-label]').textContent.includes('EXECUTION_STARTED')"
    )
    state = json.loads(page.locator("[data-state]").text_content())
    assert state["last_sequence"] == 0 and state["status"] == "running" and state["ui"] == {}
    # And with the keyboard to the position after the first UI patch.
    slider.focus()
    for _ in range(2):
        page.keyboard.press("ArrowRight")
    page.wait_for_function(
        "JSON.parse(document.querySelector('[data-state]').textContent).last_sequence === 2"
    )
    state = json.loads(page.locator("[data-state]").text_content())
    assert state["ui"] == {"phase": "scored"}
    assert json.loads(page.locator("[data-ui]").text_content()) == {"phase": "scored"}
    shot(page, "execution-slider")


def test_log_content_is_shown_as_text(console: Console, page: Any) -> None:
    page.goto(console.url + "/executions/review-0")
    page.locator("details").first.evaluate("d => d.open = true")
    assert page.title() != "owned"
    assert page.locator("script:not([src])").count() == 0
    texts = page.locator("pre.json").all_text_contents()
    assert any("<script>" in t for t in texts), "the step output is shown, as text"
    assert page.locator("b", has_text="bold?").count() == 0


def test_approve_with_identity_and_watch_live(console: Console, page: Any) -> None:
    page.goto(console.url + "/gates")
    shot(page, "gates")
    # A malformed approval (an empty identity fails the schema) is refused on the page.
    form = page.locator("[data-gate-form]").filter(has=page.locator("input[value=Approval]")).first
    page.locator("section.card", has_text="review-0").locator("button[value=approve]").click()
    page.wait_for_selector("[data-error]")
    assert "ResumeValidationError" in page.locator("[data-error]").text_content()
    assert "approved_by" in page.locator("[data-error]").text_content()
    shot(page, "gate-refused")
    assert form is not None
    shown = json.loads(_cli("show", "review-0", "--db", str(console.db), "--json").stdout)
    assert shown["state"]["status"] == "suspended"  # nothing was recorded

    # Approve with an identity from the execution page.
    page.goto(console.url + "/executions/review-0")
    page.fill("input[name=approved_by]", "dana@example.com")
    page.fill("input[name=note]", "ship it")
    page.click("button[value=approve]")
    page.wait_for_url("**/executions/review-0")
    page.wait_for_function(
        "document.querySelector('[data-execution]').dataset.statusValue === 'completed'"
    )
    rows = json.loads(_cli("logs", "review-0", "--db", str(console.db), "--json").stdout)
    resumed = next(r for r in rows if r["type"] == "EXECUTION_RESUMED")
    assert resumed["payload"]["payload"]["approved_by"] == "dana@example.com"
    shot(page, "execution-completed")

    # Live: an execution decided elsewhere (the CLI, another process) updates the open page.
    page.goto(console.url + "/executions/review-2")
    page.wait_for_selector("[data-live]:not([hidden])")
    before = page.locator("[data-events] tr").count()
    out = _cli(
        "reject",
        "review-2",
        "--by",
        "eve",
        "--db",
        str(console.db),
        "--app",
        "tests.support.console_flows:FLOWS",
    )
    assert out.returncode == 0, out.stdout + out.stderr
    page.wait_for_function(
        "document.querySelector('[data-execution]').dataset.statusValue === 'completed'"
    )
    assert page.locator("[data-events] tr").count() > before
    assert page.locator("[data-events] tr").last.text_content().count("EXECUTION_COMPLETED") == 1
    assert HOSTILE not in page.locator("[data-events]").inner_html()
