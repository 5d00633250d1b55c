"""The read side: what the CLI, the console and later layers ask of a store without running
anything.

``ExecutionViews(store)`` answers listing and counting from the store's execution index (no
log is folded), pages through one execution's timeline, folds an execution as of any sequence,
and follows live changes as async iterators: ``follow(execution_id)`` yields each new envelope
of one execution as it commits, ``feed(after_cursor)`` yields every summary change across the
store in commit order.
"""

from loom.views._views import ExecutionViews

__all__ = ["ExecutionViews"]
