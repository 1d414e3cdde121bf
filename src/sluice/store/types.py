"""What the store hands out and takes in: put requests/results, get results, the filter hook, dispatch requests."""
from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import NamedTuple, Protocol, runtime_checkable

import numpy as np


class GetMessageStatus(enum.Enum):
    """RocketMQ's GetMessageStatus; the broker maps it to a pull response code (rocketmq-facts e.3)."""

    FOUND = "FOUND"
    NO_MATCHED_MESSAGE = "NO_MATCHED_MESSAGE"
    MESSAGE_WAS_REMOVING = "MESSAGE_WAS_REMOVING"
    OFFSET_FOUND_NULL = "OFFSET_FOUND_NULL"
    OFFSET_OVERFLOW_BADLY = "OFFSET_OVERFLOW_BADLY"
    OFFSET_OVERFLOW_ONE = "OFFSET_OVERFLOW_ONE"
    OFFSET_TOO_SMALL = "OFFSET_TOO_SMALL"
    NO_MATCHED_LOGIC_QUEUE = "NO_MATCHED_LOGIC_QUEUE"
    NO_MESSAGE_IN_QUEUE = "NO_MESSAGE_IN_QUEUE"


@dataclass(slots=True)
class StoreMessage:
    """One message to append. ``properties`` holds every property (TAGS, KEYS, UNIQ_KEY included)."""

    topic: str
    body: bytes
    queue_id: int = 0
    properties: dict[str, str] = field(default_factory=dict)
    flag: int = 0
    sysflag: int = 0
    born_timestamp: int = 0
    born_host: tuple[str, int] = ("127.0.0.1", 0)
    reconsume_times: int = 0
    prepared_tx_offset: int = 0


class PutResult(NamedTuple):
    """One stored message. A NamedTuple rather than a frozen dataclass: one is built per message on the
    append path, and a frozen dataclass costs three times as much to construct."""

    commitlog_offset: int
    queue_offset: int
    msg_id: str  # the offset message id (store host + commit-log offset)
    store_timestamp: int
    size: int


@dataclass(slots=True)
class GetMessageResult:
    """A pull's answer. ``data`` is the raw stored records back to back: the pull response body."""

    status: GetMessageStatus
    next_begin_offset: int
    min_offset: int
    max_offset: int
    data: bytes = b""
    queue_offsets: list[int] = field(default_factory=list)
    commitlog_offsets: list[int] = field(default_factory=list)
    sizes: list[int] = field(default_factory=list)
    #: Commit-log records this pull read (served or evaluated and filtered out).
    records_read: int = 0

    @property
    def message_count(self) -> int:
        return len(self.sizes)


@runtime_checkable
class MessageFilter(Protocol):
    """The hook a pull filters with; the broker adapts tag and SQL92 selectors to it.

    ``match_units`` sees a batch of consume-queue tag codes (int64 numpy array) and returns a boolean
    mask, or None for "all pass". When ``needs_record`` is true, ``match_record`` then decides on the
    decoded properties of each stored record that passed the units.
    """

    needs_record: bool

    def match_units(self, tag_codes: np.ndarray) -> np.ndarray | None: ...

    def match_record(self, properties: dict[str, str]) -> bool: ...

    # Optional: ``select_units(tag_codes, ext_batch, unresolved) -> (mask | None, check | None)``. A filter
    # that has it sees the ConsumeQueueExt rows too (bitmaps, store times) and says per unit whether it may
    # match and whether its record must be evaluated (store.ext_files.plan_units).


@dataclass(slots=True)
class DispatchRequest:
    """One appended record as the dispatchers see it. A dispatcher may replace ``tag_code``
    (e.g. with a ConsumeQueueExt address) or fill ``bitmap``; the consume queue stores ``tag_code``."""

    topic: str
    queue_id: int
    queue_offset: int
    commitlog_offset: int
    size: int
    tag_code: int
    properties: dict[str, str]
    store_timestamp: int
    keys: list[str]
    uniq_key: str | None
    sysflag: int = 0
    bitmap: bytes | None = None


class Dispatcher(Protocol):
    """Receives every batch of dispatch requests, in commit-log order, before the consume queues."""

    def dispatch(self, requests: list[DispatchRequest]) -> None: ...


@dataclass(frozen=True, slots=True)
class Problem:
    """One thing ``check()`` found wrong: where it is and what."""

    path: str
    offset: int
    message: str

    def __str__(self) -> str:
        return f"{self.path} @ {self.offset}: {self.message}"
