"""Storage: the EventStore / SnapshotStore SPI and the stores that implement it."""

from typing import TYPE_CHECKING

from loom.storage._blobs import AppendsWithBlobs, BlobStore, blob_hash
from loom.storage._branches import BranchRef, BranchRegistry, check_ref_name
from loom.storage._open import open_store
from loom.storage._spi import (
    AppendsNow,
    EventStore,
    ExecutionIndex,
    ExecutionPage,
    ExecutionQuery,
    LeaseStore,
    LoadsMany,
    MailboxStore,
    Message,
    Snapshot,
    SnapshotSegments,
    SnapshotStore,
    Store,
    StoredExecution,
    TakeOver,
    TakesOverMany,
    Timer,
    TimerStore,
)
from loom.storage.memory import InMemoryStore
from loom.storage.sqlite import SQLiteStore
from loom.storage.tenancy import TenantScopedEventStore

if TYPE_CHECKING:
    from loom.storage.postgres import PostgresStore

__all__ = [
    "AppendsNow",
    "AppendsWithBlobs",
    "BlobStore",
    "BranchRef",
    "BranchRegistry",
    "EventStore",
    "ExecutionIndex",
    "ExecutionPage",
    "ExecutionQuery",
    "InMemoryStore",
    "LeaseStore",
    "LoadsMany",
    "MailboxStore",
    "Message",
    "PostgresStore",
    "SQLiteStore",
    "Snapshot",
    "SnapshotSegments",
    "SnapshotStore",
    "Store",
    "StoredExecution",
    "TakeOver",
    "TakesOverMany",
    "TenantScopedEventStore",
    "Timer",
    "TimerStore",
    "blob_hash",
    "check_ref_name",
    "open_store",
]


def __getattr__(name: str) -> object:
    # PostgresStore needs the optional psycopg extra: import it only when asked for.
    if name == "PostgresStore":
        try:
            from loom.storage.postgres import PostgresStore
        except ImportError as exc:
            raise ImportError(
                f"PostgresStore needs the 'postgres' extra ({exc.name} is not installed): "
                "pip install 'loom-runtime[postgres]'"
            ) from exc
        return PostgresStore
    raise AttributeError(f"module 'loom.storage' has no attribute {name!r}")
