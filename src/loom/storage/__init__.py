"""Storage: the EventStore / SnapshotStore SPI and the stores that implement it."""

from loom.storage._spi import EventStore, Snapshot, SnapshotStore, Store, Timer, TimerStore
from loom.storage.memory import InMemoryStore
from loom.storage.sqlite import SQLiteStore

__all__ = [
    "EventStore",
    "InMemoryStore",
    "SQLiteStore",
    "Snapshot",
    "SnapshotStore",
    "Store",
    "Timer",
    "TimerStore",
]
