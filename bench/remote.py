"""Added latency per dispatch: a remote HTTP worker versus an in-process one, 3-step flow.

    .venv/bin/python bench/remote.py [--n 300] [--warmup 30] [--store sqlite|postgres]
                                     [--dsn postgresql://postgres@127.0.0.1:5432/test]

Each row is a ``LocalDispatcher.dispatch`` of a fresh execution of the same 3-step flow, timed
from the call to the returned result (start, three durable steps, completion):

* ``local``: ``LocalWorkerRuntime`` in this process (the baseline);
* ``remote-asgi``: ``RemoteWorkerRuntime`` speaking the HTTP protocol to the worker app in this
  process (httpx.ASGITransport): the cost of the protocol, JSON and auth without a socket;
* ``remote-http``: ``RemoteWorkerRuntime`` over 127.0.0.1 to a ``loom worker serve`` process
  (bearer auth, keep-alive connection): the cost a real deployment pays, minus network RTT.

Every runtime has its own store (its own SQLite file, or its own PostgreSQL schema) so no mode
waits on another's locks. Modes are interleaved round by round, so drift hits all alike.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import secrets
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

import loom
from loom.placement import ExecutionPackage, LocalDispatcher, LocalWorkerRuntime
from loom.placement.http import BearerTokenAuth, RemoteWorkerRuntime, create_worker_app
from loom.storage import Store

ROOT = Path(__file__).resolve().parent.parent


@loom.step(id="bench-a")
async def step_a(n: int) -> int:
    return n + 1


@loom.step(id="bench-b")
async def step_b(n: int) -> int:
    return n * 2


@loom.step(id="bench-c")
async def step_c(n: int) -> int:
    return n - 1


@loom.flow(id="bench-three", version="1")
async def three_steps(ctx: loom.WorkflowContext, n: int) -> int:
    return await ctx.run(step_c, await ctx.run(step_b, await ctx.run(step_a, n)))


def _store(spec: str) -> Store:
    kind, _, rest = spec.partition(":")
    if kind == "sqlite":
        return loom.SQLiteStore(rest)
    from loom.storage.postgres import PostgresStore

    schema, _, dsn = rest.partition(":")
    return PostgresStore(dsn, schema=schema)


def make_runtime() -> loom.WorkflowRuntime:
    """The worker process's runtime (``--app bench.remote:make_runtime``)."""
    runtime = loom.WorkflowRuntime(_store(os.environ["LOOM_BENCH_STORE"]))
    runtime.register(three_steps)
    return runtime


def _runtime(spec: str) -> loom.WorkflowRuntime:
    runtime = loom.WorkflowRuntime(_store(spec))
    runtime.register(three_steps)
    return runtime


def _start_worker(spec: str, token: str, tmp: Path) -> tuple[subprocess.Popen[bytes], str]:
    port_file = tmp / "worker.port"
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "LOOM_BENCH_STORE": spec,
        "LOOM_BENCH_TOKEN": token,
    }
    log = open(tmp / "worker.log", "wb")  # noqa: SIM115 - handed to the child
    command = [sys.executable, "-m", "loom.cli._worker", "serve"]
    command += ["--app", "bench.remote:make_runtime", "--host", "127.0.0.1", "--port", "0"]
    command += ["--port-file", str(port_file), "--token-env", "LOOM_BENCH_TOKEN"]
    command += ["--log-level", "warning"]
    proc = subprocess.Popen(
        command,
        env=env,
        cwd=ROOT,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    log.close()
    deadline = time.monotonic() + 30
    while not port_file.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise SystemExit(f"the worker did not start:\n{(tmp / 'worker.log').read_text()}")
        time.sleep(0.02)
    url = f"http://127.0.0.1:{int(port_file.read_text())}"
    while True:
        try:
            if httpx.get(url + "/healthz", timeout=2).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline:
            proc.kill()
            raise SystemExit("the worker never answered /healthz")
        time.sleep(0.02)


def _pct(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


async def run(n: int, warmup: int, specs: dict[str, str], tmp: Path) -> dict[str, list[float]]:
    token = secrets.token_hex(16)
    proc, url = _start_worker(specs["remote-http"], token, tmp)
    local_rt = _runtime(specs["local"])
    asgi_rt = _runtime(specs["remote-asgi"])
    app = create_worker_app(asgi_rt, auth=BearerTokenAuth(token))
    asgi_client = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://asgi")
    http_client = httpx.AsyncClient(limits=httpx.Limits(max_keepalive_connections=4))
    modes: dict[str, LocalDispatcher] = {
        "local": LocalDispatcher(LocalWorkerRuntime(local_rt)),
        "remote-asgi": LocalDispatcher(
            RemoteWorkerRuntime("http://asgi", token=token, client=asgi_client)
        ),
        "remote-http": LocalDispatcher(RemoteWorkerRuntime(url, token=token, client=http_client)),
    }
    samples: dict[str, list[float]] = {mode: [] for mode in modes}
    names = list(modes)
    try:
        for i in range(warmup + n):
            # Rotate the order each round: no mode always runs right after another.
            for mode in names[i % 3 :] + names[: i % 3]:
                package = ExecutionPackage(
                    execution_id=f"{mode}-{i}", flow_id="bench-three", input=i
                )
                start = time.perf_counter()
                result = await modes[mode].dispatch(package)
                elapsed = time.perf_counter() - start
                if result.output != (i + 1) * 2 - 1:
                    raise SystemExit(f"{mode} returned {result.output!r} for input {i}")
                if i >= warmup:
                    samples[mode].append(elapsed * 1000)
    finally:
        await asgi_client.aclose()
        await http_client.aclose()
        await local_rt.close()
        await asgi_rt.close()
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)
    return samples


def _added(mode: str, value: float, base: float) -> str:
    return "-" if mode == "local" else f"{value - base:+.2f}"


def table(samples: dict[str, list[float]], title: str) -> str:
    base = samples["local"]
    b50, b99 = _pct(base, 0.50), _pct(base, 0.99)
    rows = [
        title,
        f"{'mode':<12} {'n':>5} {'p50 ms':>8} {'p99 ms':>8} {'mean ms':>8} "
        f"{'added p50':>10} {'added p99':>10}",
    ]
    for mode, values in samples.items():
        p50, p99 = _pct(values, 0.50), _pct(values, 0.99)
        rows.append(
            f"{mode:<12} {len(values):>5} {p50:>8.2f} {p99:>8.2f} "
            f"{statistics.fmean(values):>8.2f} {_added(mode, p50, b50):>10} "
            f"{_added(mode, p99, b99):>10}"
        )
    return "\n".join(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--n", type=int, default=300, help="timed dispatches per mode")
    parser.add_argument("--warmup", type=int, default=30, help="untimed dispatches per mode")
    parser.add_argument("--store", choices=["sqlite", "postgres"], default="sqlite")
    parser.add_argument("--dsn", default="postgresql://postgres@127.0.0.1:5432/test")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="loom-bench-remote-") as folder:
        tmp = Path(folder)
        modes = ["local", "remote-asgi", "remote-http"]
        if args.store == "sqlite":
            specs = {m: f"sqlite:{tmp / (m + '.db')}" for m in modes}
        else:
            tag = secrets.token_hex(3)
            specs = {m: f"postgres:bench_{m.replace('-', '_')}_{tag}:{args.dsn}" for m in modes}
        try:
            samples = asyncio.run(run(args.n, args.warmup, specs, tmp))
        finally:
            if args.store == "postgres":
                from loom.storage.postgres import PostgresStore

                for spec in specs.values():
                    schema, _, dsn = spec.partition(":")[2].partition(":")
                    asyncio.run(PostgresStore.drop_schema(dsn, schema))
    title = (
        f"3-step flow, {args.n} dispatches per mode after {args.warmup} warm-up, "
        f"store={args.store}, Python {sys.version.split()[0]}"
    )
    print(table(samples, title))


if __name__ == "__main__":
    main()
