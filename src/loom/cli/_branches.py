"""Branching and learning commands: ``fork``, ``branches``, ``promote``, ``learn report``.

``fork`` and ``promote`` only write records (no flow code runs), so they need no ``--app``:
a forked branch at a gate is decided with ``loom resume``; one forked between steps runs on
with ``loom recover --app ...``.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Annotated, Any

import typer

from loom.cli._common import DbOption, JsonOption, StoreOption, console, print_json, run
from loom.cli._exec import command_runtime
from loom.errors import ConfigurationError
from loom.learning import Trajectory, evaluate_policy, format_report, trajectories
from loom.runtime._fork import Branch, registry_of
from loom.storage import BranchRef

__all__ = ["register"]

learn_app = typer.Typer(
    help="Learning from the log: coverage of logged decisions, off-policy evaluation.",
    no_args_is_help=True,
    rich_markup_mode=None,
)


def fork(
    execution_id: Annotated[str, typer.Argument(metavar="EXECUTION_ID", show_default=False)],
    at: Annotated[
        int | None,
        typer.Option("--at", metavar="N", help="The fork point (default: the parent's head)."),
    ] = None,
    branch: Annotated[
        str | None,
        typer.Option("--branch", metavar="NAME", help="Register the branch as ref NAME."),
    ] = None,
    new_id: Annotated[
        str | None,
        typer.Option("--id", metavar="ID", help="The branch's execution id (default: new)."),
    ] = None,
    store: StoreOption = None,
    db: DbOption = None,
    as_json: JsonOption = False,
) -> None:
    """Fork an execution at sequence N into a new execution (the parent is untouched)."""

    async def go() -> Branch:
        async with command_runtime(
            store=store, db=db, app_spec=None, mode="write", command="fork"
        ) as (rt, _):
            return await rt.fork(execution_id, at, branch=branch, execution_id=new_id)

    made = run(go, as_json)
    if as_json:
        print_json(made.to_dict())
        return
    waiting = made.state.waiting
    what = (
        f"waits for {waiting.event_type!r} (decide it with `loom resume {made.execution_id} "
        f"{waiting.event_type}`)"
        if waiting is not None
        else f"is {made.state.status.value}"
    )
    ref = f" as ref {made.ref.name!r}" if made.ref is not None else ""
    console.print(
        f"forked {made.parent_id} at sequence {made.at_sequence} into {made.execution_id}{ref}; "
        f"the branch {what}",
        markup=False,
        soft_wrap=True,
    )


def _ref_rows(refs: list[BranchRef]) -> None:
    from rich.table import Table

    table = Table(box=None, header_style="bold")
    for col in ("REF", "EXECUTION", "TIP", "FORKED FROM", "VERSION", "PROMOTED FROM", "BY"):
        table.add_column(col)
    for r in refs:
        origin = f"{r.forked_from}@{r.fork_sequence}" if r.forked_from else "-"
        table.add_row(
            r.name,
            r.execution_id,
            str(r.tip),
            origin,
            str(r.version),
            r.promoted_from or "-",
            r.updated_by or "-",
        )
    console.print(table)


def branches(
    prefix: Annotated[
        str, typer.Option("--prefix", metavar="TEXT", help="Only refs whose name starts so.")
    ] = "",
    store: StoreOption = None,
    db: DbOption = None,
    as_json: JsonOption = False,
) -> None:
    """List branch refs (name, execution, tip, fork point, last promotion)."""

    async def go() -> list[BranchRef]:
        async with command_runtime(
            store=store, db=db, app_spec=None, mode="read", command="branches"
        ) as (rt, _):
            return await registry_of(rt).list_refs(prefix)

    refs = run(go, as_json)
    if as_json:
        print_json({"refs": [r.to_dict() for r in refs]})
    elif not refs:
        console.print("no branch refs" + (f" starting with {prefix!r}" if prefix else ""))
    else:
        _ref_rows(refs)


def promote(
    from_ref: Annotated[str, typer.Argument(metavar="FROM", show_default=False)],
    to_ref: Annotated[str, typer.Argument(metavar="TO", show_default=False)],
    by: Annotated[str, typer.Option("--by", metavar="NAME", help="Who promotes (recorded).")] = "",
    reason: Annotated[
        str | None, typer.Option("--reason", metavar="TEXT", help="Recorded with it.")
    ] = None,
    store: StoreOption = None,
    db: DbOption = None,
    as_json: JsonOption = False,
) -> None:
    """Fast-forward ref TO onto branch ref FROM; the parent's gate it was forked at closes."""

    async def go() -> BranchRef:
        if not by.strip():
            raise ConfigurationError(
                "a promotion records who made it: pass --by NAME", hint="Nothing was changed"
            )
        async with command_runtime(
            store=store, db=db, app_spec=None, mode="write", command="promote"
        ) as (rt, _):
            return await rt.promote(from_ref, to_ref, by=by, reason=reason)

    moved = run(go, as_json)
    if as_json:
        print_json(moved.to_dict())
        return
    console.print(
        f"promoted {from_ref} into {to_ref}: {to_ref} now points at {moved.execution_id} "
        f"sequence {moved.tip} (by {moved.updated_by})",
        markup=False,
        soft_wrap=True,
    )


def coverage(trajs: list[Trajectory]) -> dict[str, Any]:
    """What a log offers off-policy evaluation, and what blocks it."""
    decisions = len(trajs)
    with_context = sum(1 for t in trajs if t.context is not None and t.actions)
    with_propensity = sum(1 for t in trajs if t.propensity is not None)
    scored = sum(1 for t in trajs if t.reward is not None)
    arms: dict[str, list[float]] = defaultdict(list)
    for t in trajs:
        if t.reward is not None:
            arms[repr(t.action)].append(t.reward)
    gaps = []
    if decisions == 0:
        gaps.append("no decisions logged: use ctx.decide_with_policy in a flow")
    if decisions - with_propensity:
        gaps.append(
            f"{decisions - with_propensity} decision(s) are blind (no propensity): "
            "record them with ctx.decide_with_policy"
        )
    if decisions - with_context:
        gaps.append(f"{decisions - with_context} decision(s) lack a context or alternatives")
    if decisions - scored:
        gaps.append(
            f"{decisions - scored} decision(s) have no outcome yet: ctx.record_outcome or "
            "runtime.record_outcome"
        )
    return {
        "executions": len({t.execution_id for t in trajs}),
        "decisions": decisions,
        "with_context": with_context,
        "with_propensity": with_propensity,
        "scored": scored,
        "arms": [
            {"action": a, "n": len(r), "mean_reward": sum(r) / len(r)}
            for a, r in sorted(arms.items(), key=lambda kv: -sum(kv[1]) / len(kv[1]))
        ],
        "gaps": gaps,
    }


@learn_app.command("report")
def learn_report(
    policy: Annotated[
        str | None,
        typer.Option(
            "--policy",
            metavar="MODULE:ATTR",
            help="Also estimate this policy's value from the log (SNIPS, IPS, ESS, CI).",
        ),
    ] = None,
    decision: Annotated[
        str | None, typer.Option("--decision", metavar="ID", help="Only this decision id.")
    ] = None,
    include_simulations: Annotated[
        bool,
        typer.Option(
            "--include-simulations",
            help="Also count decisions and scores of branches forked as simulations "
            "(their effects were dry-run).",
        ),
    ] = False,
    store: StoreOption = None,
    db: DbOption = None,
    as_json: JsonOption = False,
) -> None:
    """Coverage of the logged decisions (and a policy's estimated value with --policy)."""

    async def go() -> tuple[dict[str, Any], Any]:
        target = None
        if policy is not None:
            from loom.cli._load import import_target

            target = import_target(policy)
            if isinstance(target, type):
                target = target()
        async with command_runtime(
            store=store, db=db, app_spec=None, mode="read", command="learn report"
        ) as (rt, _):
            trajs = await trajectories(
                rt.store, decision_id=decision, include_simulations=include_simulations
            )
        report = None if target is None else evaluate_policy(trajs, target)
        return coverage(trajs), report

    cov, report = run(go, as_json)
    if as_json:
        out: dict[str, Any] = {"coverage": cov}
        if report is not None:
            out["policy"] = {
                "policy_id": report.policy_id,
                "estimator": report.estimator,
                "value": report.value,
                "snips": report.snips,
                "ips": report.ips,
                "ess": report.ess,
                "ci": list(report.ci) if report.ci is not None else None,
                "agreement": report.agreement,
                "warnings": list(report.warnings),
            }
        print_json(out)
        return
    console.print(
        f"{cov['executions']} executions, {cov['decisions']} decisions: "
        f"{cov['with_context']} with context, {cov['with_propensity']} with propensity, "
        f"{cov['scored']} scored",
        markup=False,
        soft_wrap=True,
    )
    for arm in cov["arms"]:
        console.print(
            f"  arm {arm['action']}: n={arm['n']} mean reward {arm['mean_reward']:.4f}",
            markup=False,
        )
    for gap in cov["gaps"]:
        console.print(f"  gap: {gap}", markup=False, soft_wrap=True)
    if report is not None:
        console.print(format_report(report), markup=False, soft_wrap=True)


def register(app: typer.Typer) -> None:
    for fn in (fork, branches, promote):
        app.command()(fn)
    app.add_typer(learn_app, name="learn")
