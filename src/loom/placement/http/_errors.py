"""The errors of the HTTP placement layer; they live in :mod:`loom.errors` so that they
round-trip through JSON like every other Loom error."""

from __future__ import annotations

from loom.errors import AuthenticationError, RemoteWorkerError

__all__ = ["AuthenticationError", "RemoteWorkerError"]
