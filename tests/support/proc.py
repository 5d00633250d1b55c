"""The one way the tests start a process of their own: ``python -m MODULE ARGS`` from the
repository root, with the repository on PYTHONPATH and no fault armed unless the test arms it.

* ``run_child``: run it to its end (a child that SIGKILLs itself at a fault point, a recovery
  pass in a fresh process) and return the CompletedProcess with its captured output.
* ``Child``: start it in the background; ``ready()`` waits (with a deadline) for its ready line,
  ``kill()`` SIGKILLs and reaps it, ``finish()`` waits for its end and collects its output. A
  ``log`` path sends stdout and stderr there instead (a long-lived server's log). A server
  child: ``serving(port_file)`` (``serving_sync`` in synchronous tests) waits, with a deadline,
  for the port (or URL) it writes and for its health path to answer 200; returns its URL.

Modules named without a dot are entry points in tests/children (``run_child("crash", ...)``).
"""

from __future__ import annotations

import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from types import TracebackType
from typing import IO

import httpx

from tests.support.poll import until, until_sync

__all__ = ["ROOT", "Child", "child_env", "module_args", "run_child"]

ROOT = Path(__file__).resolve().parents[2]

# Variables a child inherits only when the test sets them itself: an armed fault or a
# scenario switch left in the parent's environment must not leak into every child.
_PRIVATE = ("LOOM_FAULTS",)


def child_env(
    env: Mapping[str, str] | None = None, *, drop: tuple[str, ...] = ()
) -> dict[str, str]:
    """The parent's environment with the repository on PYTHONPATH, minus ``LOOM_FAULTS`` and
    ``drop``, plus ``env``."""
    out = {k: v for k, v in os.environ.items() if k not in _PRIVATE + drop}
    out["PYTHONPATH"] = str(ROOT)
    out.update(env or {})
    return out


def module_args(module: str, *args: str | Path) -> list[str]:
    """The command line of ``python -m module args`` (tests/children when ``module`` has no dot)."""
    full = module if "." in module else f"tests.children.{module}"
    return [sys.executable, "-m", full, *map(str, args)]


def run_child(
    module: str,
    *args: str | Path,
    env: Mapping[str, str] | None = None,
    drop: tuple[str, ...] = (),
    timeout: float = 120,
    check: bool = False,
    capture: bool = True,
    cwd: Path | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run ``python -m module args`` to its end (from ``cwd``, the repository root unless
    given); its output captured as text."""
    return subprocess.run(
        module_args(module, *args),
        cwd=cwd or ROOT,
        env=child_env(env, drop=drop),
        capture_output=capture,
        text=True,
        timeout=timeout,
        check=check,
    )


class Child:
    """``python -m module args`` running in the background (a context manager that SIGKILLs it
    on exit if it still runs). ``module`` may instead be a whole command line (a list): the
    installed ``loom`` script, run as a user runs it."""

    def __init__(
        self,
        module: str | list[str],
        *args: str | Path,
        env: Mapping[str, str] | None = None,
        drop: tuple[str, ...] = (),
        stdin: bool = False,
        log: Path | None = None,
        stderr: bool = True,
        cwd: Path | None = None,
    ) -> None:
        """``stderr=False`` leaves stderr on the test's own (a long-lived child that may write
        much of it and is never asked for it); ``cwd`` runs it elsewhere than the root."""
        if isinstance(module, list):
            self.args = [*module, *map(str, args)]
            self.name = " ".join(Path(a).name for a in self.args[:2])
        else:
            self.args = module_args(module, *args)
            self.name = self.args[2]
        self.log = log
        self._log_file: IO[bytes] | None = open(log, "wb") if log is not None else None  # noqa: SIM115
        out: IO[bytes] | int = self._log_file if self._log_file is not None else subprocess.PIPE
        err: int | None = subprocess.STDOUT if self._log_file is not None else subprocess.PIPE
        if not stderr and self._log_file is None:
            err = None
        self.popen = subprocess.Popen(
            self.args,
            cwd=cwd or ROOT,
            env=child_env(env, drop=drop),
            stdin=subprocess.PIPE if stdin else subprocess.DEVNULL,
            stdout=out,
            stderr=err,
        )
        self._lines: queue.Queue[bytes] | None = None
        self._pump_thread: threading.Thread | None = None
        self.seen: list[str] = []  # stdout lines read by ready()

    @property
    def pid(self) -> int:
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen.poll() is None

    def send(self, line: str) -> None:
        """Write one line to the child's stdin."""
        assert self.popen.stdin is not None, "started without stdin=True"
        self.popen.stdin.write(line.encode() + b"\n")
        self.popen.stdin.flush()

    def ready(self, line: str = "ready", *, timeout: float = 60) -> str:
        """Wait until the child prints ``line`` (a line starting with it) on stdout; return that
        line. Fails at the deadline, or at once if the child ends first, with its output."""
        assert self.popen.stdout is not None, "a child with a log file has no ready line"
        if self._lines is None:
            self._lines = queue.Queue()
            self._pump_thread = threading.Thread(target=self._pump, daemon=True)
            self._pump_thread.start()
        deadline = time.monotonic() + timeout
        while True:
            try:
                raw = self._lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                raise AssertionError(
                    f"{self.name} printed no {line!r} within {timeout}s; saw {self.seen}"
                ) from None
            if raw == b"":
                code = self.popen.wait(timeout=30)
                raise AssertionError(
                    f"{self.name} ended ({code}) before {line!r}; saw {self.seen}; "
                    f"stderr: {self._stderr()}"
                )
            text = raw.decode(errors="replace").rstrip("\n")
            self.seen.append(text)
            if text.startswith(line):
                return text

    def _url(self, where: Path | str) -> str | None:
        """The URL the child serves on: ``where`` itself, or read from the port file ``where``
        (a port number or a whole URL) once written. Fails at once if the child has ended."""
        if not self.alive():
            raise AssertionError(
                f"{self.name} ended ({self.popen.returncode}) before serving: {self._stderr()}"
            )
        if isinstance(where, str):
            return where
        try:
            text = where.read_text().strip()
        except OSError:
            return None
        if not text:
            return None
        return text if "://" in text else f"http://127.0.0.1:{int(text)}"

    async def serving(
        self, where: Path | str, *, health: str | None = "/healthz", timeout: float = 30
    ) -> str:
        """Wait until the child serves: its port file ``where`` is written (or ``where`` is
        its URL) and, unless ``health`` is None, GET ``health`` answers 200. Returns the URL."""
        url = await until(lambda: self._url(where), f"{self.name}'s port", timeout=timeout)
        if health is not None:
            async with httpx.AsyncClient() as client:

                async def answers() -> bool:
                    self._url(url)
                    try:
                        return (await client.get(url + health, timeout=2)).status_code == 200
                    except httpx.HTTPError:
                        return False

                await until(answers, f"{self.name}'s {health}", timeout=timeout, every=0.05)
        return url

    def serving_sync(
        self, where: Path | str, *, health: str | None = "/healthz", timeout: float = 30
    ) -> str:
        """``serving`` for synchronous tests."""
        url = until_sync(lambda: self._url(where), f"{self.name}'s port", timeout=timeout)
        if health is not None:

            def answers() -> bool:
                self._url(url)
                try:
                    return httpx.get(url + health, timeout=2).status_code == 200
                except httpx.HTTPError:
                    return False

            until_sync(answers, f"{self.name}'s {health}", timeout=timeout)
        return url

    def _pump(self) -> None:
        assert self.popen.stdout is not None and self._lines is not None
        for raw in iter(self.popen.stdout.readline, b""):
            self._lines.put(raw)
        self._lines.put(b"")

    def _stderr(self) -> str:
        if self.popen.stderr is None:
            return self.tail() or "<not captured>"
        return self.popen.stderr.read().decode(errors="replace")

    def signal(self, sig: signal.Signals) -> None:
        if self.alive():
            self.popen.send_signal(sig)

    def kill(self) -> int:
        """SIGKILL (resuming it first if stopped) and reap; return the exit code."""
        if self.alive():
            self.popen.send_signal(signal.SIGCONT)
            self.popen.send_signal(signal.SIGKILL)
        code = self.popen.wait(timeout=30)
        self._close()
        return code

    def finish(self, *, timeout: float = 60) -> tuple[int, str, str]:
        """Wait for the child's end (closing its stdin); return (code, stdout, stderr). A
        child that outlives ``timeout`` is SIGKILLed and the test fails with its output."""
        try:
            if self._lines is not None:  # ready() owns stdout: drain what the pump collected
                self._close_stdin()
                code = self.popen.wait(timeout=timeout)
                out = self._drain()
                err = self._stderr()
            else:
                raw_out, raw_err = self.popen.communicate(timeout=timeout)
                code = self.popen.returncode
                out = (raw_out or b"").decode(errors="replace")
                err = (raw_err or b"").decode(errors="replace") if self.log is None else self.tail()
        except subprocess.TimeoutExpired:
            self.kill()
            raise AssertionError(f"{self.name} did not end within {timeout}s") from None
        self._close()
        return code, out, err

    def _drain(self) -> str:
        assert self._lines is not None
        while True:
            raw = self._lines.get(timeout=30)
            if raw == b"":
                return "\n".join(self.seen) + ("\n" if self.seen else "")
            self.seen.append(raw.decode(errors="replace").rstrip("\n"))

    def tail(self, lines: int = 40) -> str:
        """The end of the child's log file (children started with ``log``)."""
        if self.log is None:
            return ""
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "<no log>"

    def _close_stdin(self) -> None:
        if self.popen.stdin is not None and not self.popen.stdin.closed:
            self.popen.stdin.close()

    def _close(self) -> None:
        """Close every pipe (the child has ended; the pump, if any, has seen its EOF)."""
        if self._log_file is not None:
            self._log_file.close()
            self._log_file = None
        self._close_stdin()
        if self._pump_thread is not None:
            self._pump_thread.join(timeout=30)
        for stream in (self.popen.stdout, self.popen.stderr):
            if stream is not None and not stream.closed:
                stream.close()

    def __enter__(self) -> Child:
        return self

    def __exit__(
        self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self.alive():
            self.kill()
        else:
            self.popen.wait()
        self._close()
