"""asyncio helpers shared by the background loops of the runtime and the stores."""

from __future__ import annotations

import asyncio

__all__ = ["raise_if_cancel_swallowed"]


def raise_if_cancel_swallowed() -> None:
    """Raise CancelledError if the current task was asked to stop but nothing raised it.

    On Python 3.11, ``asyncio.wait_for`` (used inside psycopg_pool and other libraries) drops a
    cancel that arrives just as the awaited operation completes: the caller gets the result
    and the task keeps running with its cancel request still pending. A background loop that
    catches ``Exception`` and goes round again would then never end, and whoever awaits it in
    ``stop()`` would wait forever. Calling this once per round turns that lost cancel back into
    the CancelledError the loop was meant to see.
    """
    task = asyncio.current_task()
    if task is not None and task.cancelling() > 0:
        raise asyncio.CancelledError
