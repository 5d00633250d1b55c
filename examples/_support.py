"""What every example suite shares: the store it runs on, the effect ledger that proves what
ran how often, the model (scripted offline, a real one when a key is set), and the placement
its executions go through (a LocalDispatcher over a LocalWorkerRuntime, or HTTP worker
processes behind RemoteWorkerRuntime).

Environment (read by the suites' ``make_runtime`` functions, also inside worker processes):

* ``LOOM_EXAMPLE_STORE``: ``sqlite:<path>`` (default ``sqlite:loom-examples.db``) or
  ``postgres:<schema>:<dsn>``;
* ``LOOM_EXAMPLE_LEDGER``: the effect ledger, a SQLite file (default ``loom-examples-effects.db``);
* ``LOOM_EXAMPLE_PROVIDER``: ``scripted`` (default), ``anthropic``, ``openai`` or ``gemini``
  (the matching API key must be set); ``LOOM_EXAMPLE_MODEL`` overrides the model name.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sqlite3
import subprocess
import sys
import tempfile
from collections import Counter
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import loom
from loom.llm import CompletionRequest, CompletionResponse, LlmProvider, ScriptedProvider
from loom.placement import (
    ExecutionDispatcher,
    ExecutionPackage,
    ExecutionResult,
    Intent,
    LocalDispatcher,
    LocalWorkerRuntime,
    ResumeEvent,
)
from loom.storage import ExecutionIndex, SQLiteStore, Store

ROOT = Path(__file__).resolve().parent.parent
STORE_ENV = "LOOM_EXAMPLE_STORE"
LEDGER_ENV = "LOOM_EXAMPLE_LEDGER"
PROVIDER_ENV = "LOOM_EXAMPLE_PROVIDER"
MODEL_ENV = "LOOM_EXAMPLE_MODEL"
WORKER_TOKEN_ENV = "LOOM_EXAMPLE_WORKER_TOKEN"

# ------------------------------------------------------------------------------ the store


def store_spec() -> str:
    return os.environ.get(STORE_ENV, "sqlite:loom-examples.db")


def open_store(spec: str | None = None) -> Store:
    """The store named by ``spec`` (default: ``LOOM_EXAMPLE_STORE``)."""
    kind, _, rest = (spec or store_spec()).partition(":")
    if kind == "sqlite":
        return SQLiteStore(rest)
    if kind == "postgres":
        from loom.storage.postgres import PostgresStore

        schema, _, dsn = rest.partition(":")
        return PostgresStore(dsn, schema=schema, pool_max=4)
    raise ValueError(f"{STORE_ENV} must be sqlite:<path> or postgres:<schema>:<dsn>, not {spec!r}")


def index_of(store: Store) -> ExecutionIndex:
    """The store's execution index (every Loom store has one; listing needs it)."""
    if not isinstance(store, ExecutionIndex):
        raise TypeError(f"{type(store).__name__} has no execution index to list requests from")
    return store


# ------------------------------------------------------------------------------ the ledger


class Ledger:
    """One durable row per effect (execution id, effect name, pid): the oracle for "ran N
    times", shared by every process of a run and surviving a SIGKILL."""

    def __init__(self, path: str | os.PathLike[str] | None = None) -> None:
        self.path = str(path or os.environ.get(LEDGER_ENV, "loom-examples-effects.db"))

    def record(self, name: str, execution_id: str | None = None) -> None:
        if execution_id is None:
            info = loom.current_step()
            execution_id = info.execution_id if info is not None else ""
        with sqlite3.connect(self.path, timeout=30) as conn:
            # A SIGKILL loses nothing the kernel already has; only a power cut would need
            # an fsync here, and the ledger is a demo's oracle, not the system of record.
            conn.execute("PRAGMA synchronous=OFF")
            conn.execute(
                "CREATE TABLE IF NOT EXISTS effects (execution_id TEXT, name TEXT, pid INTEGER)"
            )
            conn.execute("INSERT INTO effects VALUES (?, ?, ?)", (execution_id, name, os.getpid()))

    def rows(self) -> list[tuple[str, str, int]]:
        if not Path(self.path).exists():
            return []
        conn = sqlite3.connect(self.path, timeout=30)
        try:
            rows = conn.execute("SELECT execution_id, name, pid FROM effects").fetchall()
        except sqlite3.OperationalError:
            return []  # no effect yet: the table is created by the first one
        finally:
            conn.close()
        return [(str(e), str(n), int(p)) for e, n, p in rows]

    def counts(self, execution_id: str | None = None) -> Counter[str]:
        """How often each effect ran (of one execution, or of all)."""
        return Counter(n for e, n, _ in self.rows() if execution_id in (None, e))


def executed_lines(counts: Counter[str], order: Sequence[str] = ()) -> list[str]:
    """The effects as the original demo printed them: ``EXECUTED <effect> x<count>``."""
    names = [n for n in order if n in counts] + sorted(n for n in counts if n not in order)
    return [f"  EXECUTED {name:<28} x{counts[name]}" for name in names]


# ------------------------------------------------------------------------------ the model


class CountingProvider:
    """Counts every model call in the ledger (``model:<label>``) before delegating: the proof
    that a crash did not make the example pay for the same answer twice."""

    def __init__(self, inner: LlmProvider, label: str) -> None:
        self.inner = inner
        self.label = label
        self.name = getattr(inner, "name", "provider")

    async def complete(self, request: CompletionRequest) -> CompletionResponse:
        Ledger().record(f"model:{self.label}", _current_execution())
        return await self.inner.complete(request)


def _current_execution() -> str:
    info = loom.current_step()
    return info.execution_id if info is not None else ""


_DEFAULT_MODELS = {
    "anthropic": ("ANTHROPIC_API_KEY", "claude-sonnet-4-5"),
    "openai": ("OPENAI_API_KEY", "gpt-4.1-mini"),
    "gemini": ("GEMINI_API_KEY", "gemini-2.5-flash"),
}


def provider(label: str, script: Callable[[CompletionRequest], Any]) -> tuple[LlmProvider, str]:
    """The provider an example's agent uses and its model name: ``script`` on a
    ScriptedProvider (offline, the default), or the real service ``LOOM_EXAMPLE_PROVIDER``
    names (its API key must be set). Every call is counted in the ledger."""
    choice = os.environ.get(PROVIDER_ENV, "scripted").lower()
    inner: LlmProvider
    if choice == "scripted":
        inner, model = ScriptedProvider(script), "scripted"
    elif choice in _DEFAULT_MODELS:
        key, model = _DEFAULT_MODELS[choice]
        if not os.environ.get(key):
            raise SystemExit(f"{PROVIDER_ENV}={choice} needs {key} in the environment")
        model = os.environ.get(MODEL_ENV, model)
        from loom import llm

        cls = {"anthropic": "AnthropicProvider", "openai": "OpenAIProvider"}.get(
            choice, "GeminiProvider"
        )
        inner = getattr(llm, cls)()
    else:
        raise SystemExit(f"{PROVIDER_ENV} must be scripted, anthropic, openai or gemini")
    return CountingProvider(inner, label), model


# ------------------------------------------------------------------------------ placement


@dataclass
class Placement:
    """Where the example's executions run. ``runtime`` is the operator's view of the store
    (reads, cancel); every start, resume and continue goes through ``dispatcher``."""

    kind: str
    runtime: loom.WorkflowRuntime
    dispatcher: ExecutionDispatcher
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)

    async def start(self, flow_id: str, input: Any, execution_id: str) -> ExecutionResult:
        return await self.dispatcher.dispatch(
            ExecutionPackage(execution_id=execution_id, flow_id=flow_id, input=input)
        )

    async def resume(self, execution_id: str, event_type: str, payload: Any) -> ExecutionResult:
        state = await self.runtime.load_state(execution_id)
        assert state is not None, execution_id
        return await self.dispatcher.dispatch(
            ExecutionPackage(
                execution_id=execution_id,
                flow_id=state.flow_id,
                resume_event=ResumeEvent(event_type, payload),
                from_sequence=state.last_sequence,
            )
        )

    async def proceed(self, execution_id: str) -> ExecutionResult:
        """Continue an execution a dead process left running (only its id is needed)."""
        state = await self.runtime.load_state(execution_id)
        assert state is not None, execution_id
        return await self.dispatcher.dispatch(
            ExecutionPackage(
                execution_id=execution_id, flow_id=state.flow_id, intent=Intent.CONTINUE
            )
        )


@asynccontextmanager
async def local_placement(runtime: loom.WorkflowRuntime) -> AsyncIterator[Placement]:
    """``LocalDispatcher(LocalWorkerRuntime(runtime))``: executions run in this process."""
    async with runtime:
        yield Placement("local", runtime, LocalDispatcher(LocalWorkerRuntime(runtime)))


def worker_env(**extra: str) -> dict[str, str]:
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        WORKER_TOKEN_ENV: "example-worker-token-0123456789",
    }
    env.pop("LOOM_FAULTS", None)
    env.update(extra)
    return env


def _die_with_parent() -> None:
    """In the child, before exec: SIGKILL me when the process that started me dies (however
    it dies: a SIGKILL gives it no chance to stop its workers)."""
    import ctypes

    pr_set_pdeathsig = 1
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(pr_set_pdeathsig, signal.SIGKILL)


class WorkerProcess:
    """One ``loom worker serve`` process for an example's app, on 127.0.0.1 and a free port."""

    def __init__(self, app: str, workdir: Path, name: str, env: dict[str, str]) -> None:
        self.port_file = workdir / f"{name}.port"
        self.port_file.unlink(missing_ok=True)
        self.log = workdir / f"{name}.log"
        args = [
            sys.executable, "-m", "loom.cli._worker", "serve",
            "--app", app,
            "--host", "127.0.0.1",
            "--port", "0",
            "--port-file", str(self.port_file),
            "--token-env", WORKER_TOKEN_ENV,
            "--drain-timeout", "2",
            "--log-level", "warning",
        ]  # fmt: skip
        with open(self.log, "wb") as out:
            self.popen = subprocess.Popen(
                args,
                env=env,
                cwd=ROOT,
                stdout=out,
                stderr=subprocess.STDOUT,
                preexec_fn=_die_with_parent if sys.platform == "linux" else None,
            )
        self.url = ""

    async def ready(self, timeout: float = 30.0) -> str:
        import httpx

        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        async with httpx.AsyncClient() as client:
            while True:
                if self.popen.poll() is not None:
                    raise RuntimeError(f"worker died at startup:\n{self.log.read_text()[-2000:]}")
                if self.port_file.exists() and self.port_file.read_text().strip():
                    self.url = f"http://127.0.0.1:{int(self.port_file.read_text())}"
                    try:
                        if (await client.get(self.url + "/healthz", timeout=2)).status_code == 200:
                            return self.url
                    except httpx.HTTPError:
                        pass
                if loop.time() > deadline:
                    raise TimeoutError(f"worker not ready after {timeout}s")
                await asyncio.sleep(0.05)

    def kill(self) -> None:
        if self.popen.poll() is None:
            self.popen.send_signal(signal.SIGKILL)
        self.popen.wait(timeout=30)

    async def exited(self, timeout: float = 30.0) -> int:
        return await asyncio.to_thread(self.popen.wait, timeout)


@asynccontextmanager
async def remote_dispatcher(
    urls: Sequence[str], *, max_attempts: int = 1
) -> AsyncIterator[ExecutionDispatcher]:
    """A dispatcher over HTTP workers: the first that answers takes each package; with
    ``max_attempts`` > 1 a failed attempt (a worker died mid-request) is redispatched, to the
    next worker when that one is gone, which continues the execution from the store."""
    from loom.placement.http import FailoverWorkerRuntime, RemoteWorkerRuntime

    token = worker_env()[WORKER_TOKEN_ENV]
    remotes = [RemoteWorkerRuntime(url, token=token, timeout=120) for url in urls]
    worker: Any = remotes[0] if len(remotes) == 1 else FailoverWorkerRuntime(remotes)
    try:
        yield LocalDispatcher(worker, max_attempts=max_attempts)
    finally:
        for remote in remotes:
            await remote.close()


@asynccontextmanager
async def http_placement(
    runtime: loom.WorkflowRuntime,
    app: str,
    *,
    workers: int = 1,
    workdir: Path | None = None,
    max_attempts: int = 1,
    first_worker_faults: str | None = None,
) -> AsyncIterator[Placement]:
    """Executions run in ``workers`` HTTP worker processes serving ``app`` (module:factory)
    over the same store and ledger as this process (the environment tells them where).
    ``first_worker_faults`` arms the first worker with ``LOOM_FAULTS`` (a crash demo)."""
    own = workdir is None
    folder = Path(tempfile.mkdtemp(prefix="loom-example-")) if own else workdir
    assert folder is not None
    procs = []
    for i in range(workers):
        env = (
            worker_env(LOOM_FAULTS=first_worker_faults)
            if i == 0 and first_worker_faults
            else worker_env()
        )
        procs.append(WorkerProcess(app, folder, f"worker-{i}", env))
    try:
        urls = [await p.ready() for p in procs]
        async with runtime, remote_dispatcher(urls, max_attempts=max_attempts) as dispatcher:
            yield Placement("http", runtime, dispatcher, [p.popen for p in procs])
    finally:
        for p in procs:
            p.kill()


def set_env(store: str, ledger: str) -> None:
    """Point this process and the workers it spawns at one store and one ledger."""
    os.environ[STORE_ENV] = store
    os.environ[LEDGER_ENV] = ledger


# ------------------------------------------------------------------------------ crash acts


@dataclass
class Crash:
    exit_code: int
    left: str
    after: str


async def crash_and_continue(
    placement: Placement,
    *,
    app: str,
    flow_id: str,
    input: Any,
    execution_id: str,
    fault: str,
    workdir: Path,
) -> Crash:
    """Start ``execution_id`` in a worker process armed with ``LOOM_FAULTS=fault`` (it
    SIGKILLs itself there), then continue it from another process that is given only the
    store and the id. Local placement: both are ``python -m examples._worker`` processes;
    HTTP placement: the first is an armed HTTP worker dying mid-request, the second the
    placement's own workers."""
    import json

    armed_env = worker_env(LOOM_FAULTS=fault)
    if placement.kind == "local":
        dead = await asyncio.to_thread(
            subprocess.run,
            [sys.executable, "-m", "examples._worker", "--app", app, "--id", execution_id,
             "--flow", flow_id, "--input", json.dumps(input)],
            env=armed_env, cwd=ROOT, capture_output=True, timeout=120,
        )  # fmt: skip
        exit_code = dead.returncode
    else:
        armed = WorkerProcess(app, workdir, "worker-armed", armed_env)
        try:
            url = await armed.ready()
            async with remote_dispatcher([url]) as dispatcher:
                try:
                    await dispatcher.dispatch(
                        ExecutionPackage(execution_id=execution_id, flow_id=flow_id, input=input)
                    )
                except Exception:  # the worker died mid-request: a failed attempt
                    pass
            exit_code = await armed.exited()
        finally:
            armed.kill()
    state = await placement.runtime.load_state(execution_id)
    left = "absent" if state is None else str(state.status)
    if placement.kind == "local":
        again = await asyncio.to_thread(
            subprocess.run,
            [sys.executable, "-m", "examples._worker", "--app", app, "--id", execution_id],
            env=worker_env(), cwd=ROOT, capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        if again.returncode != 0:
            raise RuntimeError(f"the continuing worker failed:\n{again.stderr}")
        after = again.stdout.strip()
    else:
        after = str((await placement.proceed(execution_id)).status)
    return Crash(exit_code, left, after)
