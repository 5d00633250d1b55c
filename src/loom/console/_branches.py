"""The branch board: refs, their lineage, and forms to fork an execution and promote a branch.

Installed through the console's plug-in point: ``create_app(..., pages=branch_pages())`` (the
``loom console`` command does it). ``GET /branches`` shows every ref (where it points, where it
was forked from, its last promotion) and the forks of each ref's execution; the fork form
(prefilled from an execution page's "Fork…" button) posts to ``/branches/fork`` and opens the
new branch; the promote form posts to ``/branches/promote``. Refusals render the error page
with the typed error's message; nothing changes then.
"""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import RedirectResponse, Response

from loom.console._app import ConsolePage
from loom.console._security import check_csrf
from loom.errors import ConfigurationError
from loom.runtime._fork import registry_of

__all__ = ["branch_pages"]


def _runtime(request: Request) -> Any:
    return request.app.state.data.runtime


async def _form(request: Request) -> dict[str, str]:
    form = await request.form()
    await check_csrf(request, form)
    return {k: v.strip() for k, v in form.items() if isinstance(v, str)}


async def board(request: Request) -> Response:
    runtime = _runtime(request)
    registry = registry_of(runtime)
    prefix = request.query_params.get("prefix") or ""
    refs = await registry.list_refs(prefix)
    lineage = {}
    for ref in refs:
        kids = await registry.children(ref.execution_id)
        if kids:
            lineage[ref.name] = kids
    render = request.app.state.render
    response: Response = render(
        request,
        "branches.html",
        {
            "title": "Branches",
            "refs": refs,
            "lineage": lineage,
            "prefix": prefix,
            "fork_id": request.query_params.get("fork") or "",
            "fork_at": request.query_params.get("at") or "",
        },
    )
    return response


async def fork(request: Request) -> Response:
    form = await _form(request)
    parent = form.get("execution_id") or ""
    if not parent:
        raise ConfigurationError("the fork form needs the execution id to fork")
    at_text = form.get("at") or ""
    try:
        at = int(at_text) if at_text else None
    except ValueError:
        raise ConfigurationError(f"fork point {at_text!r} is not a sequence number") from None
    made = await _runtime(request).fork(
        parent, at, branch=form.get("branch") or None, execution_id=form.get("new_id") or None
    )
    return RedirectResponse(f"/executions/{made.execution_id}", status_code=303)


async def promote(request: Request) -> Response:
    form = await _form(request)
    by = form.get("by") or ""
    if not by:
        raise ConfigurationError("a promotion records who made it: fill in 'by'")
    await _runtime(request).promote(
        form.get("from_ref") or "",
        form.get("to_ref") or "",
        by=by,
        reason=form.get("reason") or None,
    )
    return RedirectResponse("/branches", status_code=303)


def branch_pages() -> list[ConsolePage]:
    """The branch board and its two form targets, for ``create_app(pages=...)``."""
    return [
        ConsolePage("/branches", "Branches", board),
        ConsolePage("/branches/fork", "Fork", fork, methods=("POST",), nav=False),
        ConsolePage("/branches/promote", "Promote", promote, methods=("POST",), nav=False),
    ]
