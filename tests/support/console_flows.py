"""Flows the console tests drive: a review with a schema'd approval gate and hostile output."""

from __future__ import annotations

from typing import Any

import pydantic

import loom

HOSTILE = "<script>document.title='owned'</script><b>bold?</b>"


class Draft(pydantic.BaseModel):
    title: str


class Review(pydantic.BaseModel):
    approved: bool
    approved_by: str = pydantic.Field(min_length=1)
    note: str = ""


@loom.step(id="fetch")
async def fetch(title: str) -> dict[str, Any]:
    return {"title": title, "body": HOSTILE}


@loom.step(id="score")
async def score(title: str) -> int:
    return len(title)


@loom.step(id="publish")
async def publish(title: str) -> str:
    return f"published {title}"


@loom.flow(id="review", version="1", resume_schemas={"Approval": Review})
async def review(ctx: loom.WorkflowContext, draft: Draft) -> dict[str, Any]:
    doc = await ctx.run(fetch, draft.title)
    ctx.ui.set("phase", "scored")
    points = await ctx.run(score, doc["title"])
    ctx.ui.set("phase", "awaiting-review")
    decision = await ctx.suspend("Approval", correlation_key=draft.title)
    if not decision.approved:
        ctx.ui.set("phase", "rejected")
        return {"published": False, "by": decision.approved_by}
    ctx.ui.set("phase", "publishing")
    done = await ctx.run(publish, draft.title)
    return {"published": True, "result": done, "score": points, "by": decision.approved_by}


FLOWS = [review]


async def populate(db: str, count: int = 3) -> list[str]:
    """``count`` reviews waiting at their gate, plus one completed and one cancelled."""
    ids = []
    async with loom.WorkflowRuntime(loom.SQLiteStore(db)) as rt:
        rt.register(review)
        for i in range(count):
            eid = f"review-{i}"
            handle = await rt.start(review, Draft(title=f"post {i}"), execution_id=eid)
            await handle.wait_for_suspend()
            ids.append(eid)
        await (
            await rt.start(review, Draft(title="done"), execution_id="review-done")
        ).wait_for_suspend()
        await (
            await rt.resume("review-done", "Approval", {"approved": True, "approved_by": "ann"})
        ).result()
        await (
            await rt.start(review, Draft(title="gone"), execution_id="review-gone")
        ).wait_for_suspend()
        await rt.cancel("review-gone", reason="tested")
    return ids
