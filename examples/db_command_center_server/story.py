"""A client driving the service over HTTP: four requests submitted, followed by id until each
settles, the pending approvals listed with their row counts, one approved, one rejected, one
cancelled, a decision on a request that no longer waits refused, the results read back, and
what ran for each request (``EXECUTED <effect> xN`` from the effect ledger)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import httpx

from examples._support import Ledger, executed_lines
from examples.db_command_center.story import ORDER, REQUESTS

Print = Callable[[str], None]
SETTLED = ("completed", "suspended", "cancelled", "failed")


async def settled(
    client: httpx.AsyncClient, url: str, eid: str, timeout: float = 60
) -> dict[str, Any]:
    """Follow a request by id until it waits or ends (polling with a deadline)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        response = await client.get(f"{url}/api/requests/{eid}")
        if response.status_code == 200 and response.json()["status"] in SETTLED:
            return dict(response.json())
        if loop.time() > deadline:
            raise TimeoutError(f"{eid} did not settle in {timeout}s: {response.text}")
        await asyncio.sleep(0.05)


async def run_client(
    url: str, say: Print = print, keys: tuple[str, ...] = ("why", "archive", "cleanup", "regions")
) -> dict[str, Any]:
    facts: dict[str, Any] = {}
    async with httpx.AsyncClient(timeout=60) as client:
        ids: dict[str, str] = {}
        for key in keys:
            response = await client.post(
                f"{url}/api/requests", json={"text": REQUESTS[key], "operator": "sam"}
            )
            assert response.status_code == 202, response.text
            ids[key] = response.json()["id"]
            say(f"POST /api/requests {REQUESTS[key]!r} -> 202 {ids[key]}")
            if len(ids) == 1:  # the first alone: a crash demo kills its worker mid-request
                await settled(client, url, ids[key])
        facts["ids"] = ids
        for key, eid in ids.items():
            view = await settled(client, url, eid)
            facts[f"{key}.first"] = view["status"]
            say(f"  {eid}: {view['status']} ({view['phase']})")
        approvals = (await client.get(f"{url}/api/approvals")).json()["approvals"]
        facts["approvals"] = {a["id"]: a["affected_rows"] for a in approvals}
        say("GET /api/approvals")
        for a in approvals:
            say(f"  {a['id']}: {a['sql']}  ({a['affected_rows']} rows)")
        if "archive" in ids:
            r = await client.post(
                f"{url}/api/requests/{ids['archive']}/approve", json={"by": "ops-lead"}
            )
            say(f"POST approve {ids['archive']} -> {r.status_code} {r.json()['status']}")
            facts["archive.approve"] = r.status_code
            again = await client.post(
                f"{url}/api/requests/{ids['archive']}/approve", json={"by": "ops-lead"}
            )
            error = again.json()["error"]
            say(f"POST approve {ids['archive']} again -> {again.status_code} {error}")
            facts["archive.again"] = again.status_code
        if "cleanup" in ids:
            nobody = await client.post(f"{url}/api/requests/{ids['cleanup']}/reject", json={})
            facts["cleanup.nobody"] = nobody.status_code
            r = await client.post(
                f"{url}/api/requests/{ids['cleanup']}/reject",
                json={"by": "ops-lead", "reason": "keep for audit"},
            )
            say(f"POST reject {ids['cleanup']} -> {r.status_code} {r.json()['status']}")
        if "regions" in ids:
            r = await client.post(
                f"{url}/api/requests/{ids['regions']}/cancel", json={"reason": "by mistake"}
            )
            say(f"POST cancel {ids['regions']} -> {r.status_code} {r.json()['status']}")
        for key, eid in ids.items():
            view = await settled(client, url, eid)
            facts[f"{key}.status"] = view["status"]
            facts[f"{key}.answer"] = view["ui"].get("answer")
            say(f"GET {eid}: {view['status']}: {view['ui'].get('answer') or ''}".rstrip(": "))
        # What ran, from the effect ledger every process of the service writes to (the
        # service's own, or its workers'): the proof a crash paid nothing twice.
        ledger = Ledger()
        executed: dict[str, list[str]] = {}
        for key, eid in ids.items():
            lines = executed_lines(ledger.counts(eid), ORDER)
            executed[key] = [" ".join(line.split()) for line in lines]
            say(f"{eid} ({key}):")
            for line in lines:
                say(line)
        facts["executed"] = executed
        facts["unattributed"] = dict(ledger.counts(""))
        listing = (await client.get(f"{url}/api/requests")).json()["requests"]
        facts["listed"] = sorted(r["id"] for r in listing)
        health = (await client.get(f"{url}/healthz")).json()
        facts["health"] = health
        for w in health["workers"]:
            state = "running" if w["exit_code"] is None else f"exited {w['exit_code']}"
            say(f"worker pid {w['pid']}: {state}")
    return facts
