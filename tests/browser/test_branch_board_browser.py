"""The branch board in a real headless Chromium: fork from an execution's page, see the branch
on the board, promote it, and the parent's gate is gone."""

from __future__ import annotations

import asyncio
import json
import subprocess
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

import loom
from tests.browser.conftest import Console, shot
from tests.support.proc import run_child

pytestmark = pytest.mark.browser


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return run_child("loom.cli", *args, timeout=60)


async def _main_ref(db: str, execution_id: str) -> None:
    store = loom.SQLiteStore(db)
    try:
        await store.put_ref("main", execution_id, await store.last_sequence(execution_id))
    finally:
        await store.close()


def test_fork_from_the_page_then_promote_on_the_board(console: Console, page: Any) -> None:
    with ThreadPoolExecutor(1) as pool:  # Playwright owns this thread's event loop
        pool.submit(asyncio.run, _main_ref(str(console.db), "review-1")).result()
    page.goto(console.url + "/executions/review-1")
    page.click("[data-fork]")
    page.wait_for_url("**/branches?fork=review-1*")
    assert page.input_value("[data-fork-form] input[name=execution_id]") == "review-1"
    page.fill("[data-fork-form] input[name=branch]", "sim/try")
    shot(page, "branch-fork-form")
    page.click("[data-fork-form] button")
    page.wait_for_selector("[data-execution]")
    branch_id = page.locator("[data-execution]").get_attribute("data-execution")
    assert branch_id and branch_id != "review-1"
    assert page.locator("[data-execution]").get_attribute("data-status-value") == "suspended"
    assert "forked from" in page.locator(".exec-head").text_content()
    shot(page, "branch-execution")

    page.goto(console.url + "/branches")
    row = page.locator("[data-ref='sim/try']")
    assert branch_id in row.text_content() and "review-1" in row.text_content()
    page.fill("[data-promote-form] input[name=from_ref]", "sim/try")
    page.fill("[data-promote-form] input[name=by]", "dana")
    page.once("dialog", lambda d: d.accept())  # the form asks for confirmation
    page.click("[data-promote-form] button")
    page.wait_for_selector("[data-ref='main']")
    main = page.locator("[data-ref='main']").text_content()
    assert branch_id in main and "from sim/try by dana" in main
    shot(page, "branch-board")

    shown = json.loads(_cli("show", "review-1", "--db", str(console.db), "--json").stdout)
    assert shown["state"]["status"] == "cancelled"
    refs = json.loads(_cli("branches", "--db", str(console.db), "--json").stdout)["refs"]
    assert {r["name"]: r["execution_id"] for r in refs}["main"] == branch_id
