"""What the store hands out and takes in: put requests/results, get results, and the two plug-in
contracts (:class:`MessageFilter` for pulls, :class:`Dispatcher` for dispatch) with base classes for them."""
from __future__ import annotations

import enum
from dataclasses import dataclass, field
from abc import abstractmethod
from typing import TYPE_CHECKING, NamedTuple, Protocol, runtime_checkable

import numpy as np

from sluice.store.dispatch_request import DispatchRequest

if TYPE_CHECKING:  # annotations only
    from sluice.store.ext_batch import ExtBatch, FewExtBatch
    from sluice.store.dispatch_columns import DispatchBatch

__all__ = [
    "DispatchRequest", "Dispatcher", "GetMessageResult", "GetMessageStatus", "MessageFilter", "Problem", "PutResult",
    "RequestDispatcher", "StoreMessage", "TagCodeFilter",
]


class GetMessageStatus(enum.Enum):
    """RocketMQ's GetMessageStatus (store/src/main/java/org/apache/rocketmq/store/GetMessageStatus.java);
    the broker maps it to a pull response code
    (broker/src/main/java/org/apache/rocketmq/broker/processor/PullMessageProcessor.java)."""

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
    append path, and a frozen dataclass costs several times as much to construct."""

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
    """The hook a pull filters with: every call the store makes on it (store/pull_read.py).

    A pull reads its queue in windows of consume-queue units. Per window the store calls
    :meth:`select_units` once, then :meth:`match_record_at` for each record the filter asked to see,
    then :meth:`consumed` once. The broker adapts tag and SQL92 selectors to it
    (broker/filtering.py SelectorFilter); :class:`TagCodeFilter` implements it for filters that decide
    on tag codes and properties alone.

    A filter whose decision depends on a few properties' values alone may name them in
    :attr:`record_keys`: the store then reads those values itself and asks :meth:`judge` once per
    distinct combination (C speedups.scan_records) instead of :meth:`match_record_at` per record, and
    reports each window's verdicts to :meth:`settle`; both ways give the same pull.
    """

    #: How many records one pull may evaluate with :meth:`match_record_at` (0: no bound). The pull stops
    #: just before the first record over it and answers what it has; its next begin offset is that
    #: record, so the next pull goes on from there and nothing is skipped.
    max_evaluations: int
    #: Whether :meth:`select_units` reads ``tag_codes`` and ``ext_batch``. False: the store skips resolving
    #: the window's ConsumeQueueExt rows and passes the units' raw tag slots and no batch (a selector
    #: evaluated on every record, with no Bloom data: a SQL92 group catching up).
    needs_units: bool

    def select_units(self, tag_codes: np.ndarray, ext_batch: ExtBatch | FewExtBatch | None,
                     unresolved: np.ndarray | None) -> tuple[np.ndarray | None, np.ndarray | None]:
        """Decide a window of units before any record is read.

        ``tag_codes`` are the units' tag codes (int64; ConsumeQueueExt addresses already resolved to
        their unit's tag code); ``ext_batch`` is the row-aligned ConsumeQueueExt rows (bitmaps, store
        times; for a few units a FewExtBatch, the same rows kept as lists), None when no unit of the window
        has one; ``unresolved`` marks units whose ext address could not be read (tag code 0 there), None
        when there are none: RocketMQ lets those through to the record. Returns ``(may_match, evaluate)``:
        a boolean mask of units that may match (None: all may), and a boolean mask of units whose record
        must go to :meth:`match_record_at` (None: none; the others that may match are served without
        looking at their record).
        """
        ...

    def match_record_at(self, index: int, properties: dict[str, str]) -> bool:
        """Does the record of unit ``index`` of the last :meth:`select_units` window pass, on its decoded
        properties? ``index`` lets a filter keep per-unit counters (bitmap false positives); it is -1
        when the record is not from a window."""
        ...

    def consumed(self, n: int) -> None:
        """The pull went on from unit ``n`` of the last :meth:`select_units` window (units before it were
        looked at, the rest were not): per-window counters and cursors are settled here; a no-op for
        filters that keep none."""
        ...

    #: The names (UTF-8) of the properties whose values alone decide a record, or None: the records the
    #: filter asks to see then go to :meth:`match_record_at` one by one.
    record_keys: tuple[bytes, ...] | None
    #: Where the store keeps :meth:`judge`'s verdicts: an object from store/pull_read.py verdict_cache(),
    #: which the filter may share between pulls (a verdict depends on the values alone); None: the
    #: records go to :meth:`match_record_at`.
    record_verdicts: object | None

    def judge(self, values: tuple[str | None, ...]) -> int:
        """The verdict on a record whose :attr:`record_keys` properties hold ``values`` (None: absent),
        as :meth:`match_record_at` would decide it: 1 passes, any other int does not (the filter may use
        them to tell outcomes apart in :meth:`settle`)."""
        ...

    def settle(self, indexes: np.ndarray, verdicts: np.ndarray) -> None:
        """The records of units ``indexes`` (int32, of the last :meth:`select_units` window, in order)
        were evaluated with these :meth:`judge` verdicts: count them as match_record_at would have."""
        ...


class TagCodeFilter(MessageFilter):
    """A MessageFilter built from two simple decisions: :meth:`match_units` on tag codes, then, when
    ``needs_record`` is true, :meth:`match_record` on each record that passed. Subclass it and
    override those (the defaults pass everything)."""

    #: True when every unit that passes match_units must also pass match_record on its record.
    needs_record: bool = False
    max_evaluations: int = 0
    needs_units: bool = True

    def match_units(self, tag_codes: np.ndarray) -> np.ndarray | None:
        """A boolean mask over ``tag_codes`` (int64) of units that may match; None for "all may"."""
        return None

    def match_record(self, properties: dict[str, str]) -> bool:
        """Does a record pass, on its decoded properties?"""
        return True

    def select_units(self, tag_codes: np.ndarray, ext_batch: ExtBatch | FewExtBatch | None,
                     unresolved: np.ndarray | None) -> tuple[np.ndarray | None, np.ndarray | None]:
        mask = self.match_units(tag_codes)
        needs = bool(self.needs_record)
        check = np.full(len(tag_codes), needs) if needs or unresolved is not None else None
        if unresolved is not None:  # no tag code to decide on: the record decides
            if mask is not None:
                mask = np.asarray(mask, dtype=bool) | unresolved
            check = check | unresolved  # type: ignore[operator]
        return mask, check

    def match_record_at(self, index: int, properties: dict[str, str]) -> bool:
        return self.match_record(properties)

    def consumed(self, n: int) -> None:
        return None

    record_keys: tuple[bytes, ...] | None = None  # decided by match_record, on every property
    record_verdicts: object | None = None

    def judge(self, values: tuple[str | None, ...]) -> int:
        # The store asks judge only of filters that name record_keys; this one names none.
        raise TypeError("a TagCodeFilter decides with match_record and names no record_keys: judge does not apply")

    def settle(self, indexes: np.ndarray, verdicts: np.ndarray) -> None:
        return None


@runtime_checkable
class Dispatcher(Protocol):
    """A plug-in that sees every appended record before the consume queues are written (store/dispatch.py):
    every call the store makes on it. Calls come from the dispatch thread, in commit-log order, one batch
    at a time; an exception is logged and the store goes on. :class:`RequestDispatcher` implements the
    columnar call for dispatchers that want requests only."""

    #: True for a dispatcher whose work the consume-queue units depend on (it sets ``tag_code`` or
    #: ``bitmap``): MessageStore.rebuild_queue runs it again over the records of a queue it rebuilds.
    rebuilds_bitmaps: bool

    def dispatch(self, requests: list[DispatchRequest]) -> None:
        """A batch of records parsed back from the log (recovery replay, a rebuilt queue), one request
        each. The dispatcher may change a request's ``tag_code`` or set its ``bitmap``."""
        ...

    def dispatch_batch(self, batch: DispatchBatch) -> None:
        """A batch of records as the appenders registered them (columns, store/dispatch_columns.py).
        A dispatcher that needs per-record requests calls ``batch.requests()`` (built once, shared by
        every dispatcher; once built they are what the units are written from); one that does not
        keeps the batch free of per-message objects."""
        ...


class RequestDispatcher(Dispatcher):
    """A Dispatcher that takes every batch as requests: subclass it and implement :meth:`dispatch`."""

    rebuilds_bitmaps: bool = False

    @abstractmethod
    def dispatch(self, requests: list[DispatchRequest]) -> None: ...

    def dispatch_batch(self, batch: DispatchBatch) -> None:
        self.dispatch(batch.requests())


@dataclass(frozen=True, slots=True)
class Problem:
    """One thing ``check()`` found wrong: where it is and what."""

    path: str
    offset: int
    message: str

    def __str__(self) -> str:
        return f"{self.path} @ {self.offset}: {self.message}"
