"""Subscriptions → store filters: the adapter between the filter package and the store's MessageFilter hook.

A TAG subscription filters on consume-queue units alone (the tag selector's
exact batch mask over tag codes, ConsumeQueueExt addresses resolved by the
store; no commit-log reads). A SQL92 subscription evaluates the stored
properties of each candidate (``match_record_at``); when the group has Bloom
data (filter_data.py) the candidates are only the units whose bitmap has the
group's bits, or that have no usable bitmap (stored before the filter data
was born, or without an ext unit): RocketMQ's ExpressionMessageFilter, in
batches. Evaluation errors count as no match and are counted in the group's
FilterMetrics. Compile errors are raised, never turned into "match all".
"""
from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass

import numpy as np

from sluice.errors import FilterEvaluationError, SelectorSyntaxError, SluiceError
from sluice.filter import BloomFilter, BloomFilterData, Selector, TagSelector, compile_selector
from sluice.protocol.bodies import SubscriptionData
from sluice.protocol.codes import ResponseCode
from sluice.store.consumequeue_ext import SMALL_BATCH, ExtBatch, FewExtBatch
from sluice.store.pull_read import verdict_cache

__all__ = ["CLASS_FILTER", "CompiledSubscription", "SelectorFilter", "class_subscription", "compile_subscription",
           "is_tag_type", "SQL92_DISABLED"]

#: The expression type the broker keeps for a class-filter subscription (classFilterMode=true on the wire):
#: the class runs in the filter servers, never here, so the broker's own filter for it passes everything.
CLASS_FILTER = "CLASS"
MAX_CLASS_NAME = 512

#: Distinct evaluation error messages a subscription keeps for its verdicts before it starts afresh.
MAX_MESSAGES = 4_096
#: Selectors whose verdict caches are kept for the next subscription of the same expression (least recently
#: compiled dropped first): a new group, a restarted consumer or a new sub_version compiles the expression
#: anew, and would otherwise judge every combination of values again on its first catch-up. Few: a cache
#: outlives its subscriptions here, and one over ever-new values grows to MAX_VERDICTS keys (megabytes).
MAX_SHARED_VERDICTS = 32

#: (selector class, expression) -> [verdict cache, its error messages], shared by every SelectorFilter of
#: that selector: a verdict depends on the selector and the values alone.
_shared_verdicts: OrderedDict[tuple[str, str], list] = OrderedDict()
_shared_lock = threading.Lock()  # selectors compile on the loop (heartbeats) and off it (selector_compile.py)


def _verdicts_of(selector: Selector) -> list:
    """The shared [verdict cache, messages] of ``selector``'s expression, made on first use."""
    key = (type(selector).__qualname__, selector.expression)
    with _shared_lock:
        entry = _shared_verdicts.get(key)
        if entry is None:
            entry = _shared_verdicts[key] = [verdict_cache(), []]
            while len(_shared_verdicts) > MAX_SHARED_VERDICTS:
                _shared_verdicts.popitem(last=False)
        else:
            _shared_verdicts.move_to_end(key)
        return entry

SQL92_DISABLED = ("The broker does not support consumer to filter message by SQL92 "
                  "(enable_property_filter is off in the broker config)")


def is_tag_type(expression_type: str | None) -> bool:
    """ExpressionType.isTagType: null, empty and TAG (any case) are tags."""
    return not expression_type or expression_type.upper() == "TAG"


class SqlFilterDisabledError(SluiceError):
    """A SQL92 subscription on a broker with enable_property_filter off (RocketMQ answers SYSTEM_ERROR)."""

    code = ResponseCode.SYSTEM_ERROR


class SelectorFilter:
    """The store's MessageFilter (store/types.py) for one compiled selector.

    The instance kept with a subscription is shared; a pull works on its own copy (:meth:`for_pull`),
    which may carry the group's Bloom data and metrics and keeps per-pull state.
    """

    __slots__ = ("selector", "needs_record", "_tag", "metrics", "bloom", "bloom_data", "live_after",
                 "_hits", "_skip", "_backfill", "_cursor", "_ruled_out", "max_evaluations", "record_keys",
                 "record_verdicts", "_messages", "_shared")

    def __init__(self, selector: Selector, *, like: SelectorFilter | None = None) -> None:
        """``like``: a filter of the same selector whose verdict cache this one shares (a pull's copy)."""
        self.selector = selector
        self._tag = selector if isinstance(selector, TagSelector) else None
        self.needs_record = self._tag is None
        self.metrics = None
        self.bloom: BloomFilter | None = None
        self.bloom_data: BloomFilterData | None = None
        self.live_after = 0
        self._hits: np.ndarray | list[bool] | None = None  # lists after _select_sql_few
        self._skip: np.ndarray | list[bool] | None = None
        self._backfill = None  # broker.backfill.QueueBackfill of this pull's group and queue
        self._cursor = 0
        self._ruled_out: np.ndarray | None = None
        #: Records one pull evaluates at most (the store stops there, store/pull_read.py); 0: no bound.
        self.max_evaluations = 0
        #: MessageFilter.record_keys: the (UTF-8) names of the properties a SQL92 selector reads, so the
        #: store judges each distinct combination of their values once (judge, settle); None for tags.
        self.record_keys: tuple[bytes, ...] | None = None
        #: The store's cache of judge's verdicts (store/pull_read.py verdict_cache), and the error messages
        #: verdicts >= 2 stand for: shared by the pull copies of one subscription (``like``) and by every
        #: subscription of the same expression (``_shared``), since evaluation depends on the values alone.
        self.record_verdicts: object | None = None
        self._messages: list[str] = []
        self._shared: list | None = None
        if like is not None:
            self.record_keys, self._shared = like.record_keys, like._shared
            self.record_verdicts, self._messages = like.record_verdicts, like._messages
        else:
            names = getattr(selector, "properties", None) if self._tag is None else None
            self.record_keys = None if names is None else tuple(n.encode() for n in names)
            if self.record_keys is not None:
                self._shared = _verdicts_of(selector)
                self.record_verdicts, self._messages = self._shared[0], self._shared[1]

    def use_backfill(self, backfill, offset: int) -> None:
        """Consult ``backfill`` (broker/backfill.py) for this pull starting at queue ``offset``: units it rules
        out are skipped unread. The store calls select_units once per window of units from the pull's
        offset and then consumed(n), so the cursor follows the window."""
        self._backfill, self._cursor = backfill, offset

    def for_pull(self, metrics=None, bloom: BloomFilter | None = None, bloom_data: BloomFilterData | None = None,
                 live_after: int = 0) -> SelectorFilter:
        """A copy for one pull; with ``bloom`` it skips units whose bitmap (stored after ``live_after``)
        lacks the bits of ``bloom_data``."""
        if len(self._messages) > MAX_MESSAGES:  # errors on ever-new values: start afresh
            self.record_verdicts, self._messages = verdict_cache(), []
            if self._shared is not None:  # and so do subscriptions of the expression compiled from now on
                self._shared[:] = [self.record_verdicts, self._messages]
        f = SelectorFilter(self.selector, like=self)
        f.metrics = metrics
        if bloom is not None and bloom_data is not None and bloom.is_valid(bloom_data) and self._tag is None:
            f.bloom, f.bloom_data, f.live_after = bloom, bloom_data, live_after
        return f

    # ---- the store's hooks -------------------------------------------------------------------------
    def match_units(self, tag_codes: np.ndarray) -> np.ndarray | None:
        if self._tag is None:
            return None
        if self._tag.sub_all:
            return None
        return self._tag.match_codes(tag_codes)

    def select_units(self, codes: np.ndarray, batch: ExtBatch | FewExtBatch | None, unresolved: np.ndarray | None
                     ) -> tuple[np.ndarray | None, np.ndarray | None]:
        """(units that may match, units whose record must be evaluated): MessageFilter.select_units."""
        self._hits = self._skip = None
        if self._tag is not None:
            if self._tag.sub_all:
                return None, None
            mask = self._tag.match_codes(codes)
            if unresolved is not None:  # an unreadable ext unit: decide on the record's TAGS
                return mask | unresolved, unresolved
            return mask, None
        keep, check = self._select_sql(codes, batch)
        bf = self._backfill
        if bf is not None:
            may = bf.may_match(self._cursor, len(codes))
            self._ruled_out = None if may is None else ~may
            if may is not None:  # a 0 bit: not read; a 1 bit is still evaluated on the record
                keep = may if keep is None else keep & may
                check = check & may
        return keep, check

    @property
    def needs_units(self) -> bool:
        """MessageFilter.needs_units: tag selectors read tag codes and Bloom data reads bitmaps; a SQL92
        selector without Bloom data (a group that subscribed after the writes) evaluates every record and
        reads neither, nor does a backfill (it follows the window's position alone)."""
        return self._tag is not None or self.bloom is not None

    def _select_sql(self, codes: np.ndarray, batch: ExtBatch | FewExtBatch | None
                    ) -> tuple[np.ndarray | None, np.ndarray]:
        check_all = np.ones(len(codes), dtype=bool)
        bloom = self.bloom
        if bloom is None or batch is None:
            return None, check_all
        nbytes = bloom.m // 8
        if batch.width < nbytes:
            return None, check_all
        if len(codes) <= SMALL_BATCH:
            return self._select_sql_few(batch, nbytes, check_all)
        return self._select_sql_many(batch, nbytes, check_all)

    def _select_sql_many(self, batch: ExtBatch, nbytes: int, check_all: np.ndarray
                         ) -> tuple[np.ndarray | None, np.ndarray]:
        """_select_sql's Bloom check over a window of units, vectorised."""
        live = batch.valid & (batch.bitmap_lengths == nbytes) & (batch.msg_store_times > self.live_after)
        if not live.any():
            return None, check_all
        hit = self.bloom.is_hit_batch(self.bloom_data,  # type: ignore[union-attr]
                                      np.ascontiguousarray(batch.bitmaps[:, :nbytes]))
        self._skip = live & ~hit
        self._hits = live & hit
        keep = ~self._skip
        return keep, keep

    def _select_sql_few(self, batch: ExtBatch | FewExtBatch, nbytes: int, check_all: np.ndarray
                        ) -> tuple[np.ndarray | None, np.ndarray]:
        """_select_sql's Bloom check for a few units (a woken held pull's window) on Python ints: the numpy
        steps' fixed costs would outweigh the work. The same results (tests/broker/test_select_few.py)."""
        after = self.live_after
        valid, lengths, times, raw = batch.row_lists()  # a FewExtBatch (get_few's) builds no array for it
        live = [v and n == nbytes and t > after for v, n, t in zip(valid, lengths, times)]
        if not any(live):
            return None, check_all
        need: dict[int, int] = {}  # byte of the bitmap -> the bits of it the group's data sets
        for pos in self.bloom_data.bit_pos:  # type: ignore[union-attr]
            need[pos >> 3] = need.get(pos >> 3, 0) | (1 << (pos & 7))
        masks = tuple(need.items())
        width = batch.width
        hit = [ok and all(raw[at + c] & m == m for c, m in masks)
               for ok, at in zip(live, range(0, len(live) * width, width))]
        self._hits = hit  # lists: consumed, settle and match_record_at read them as they read arrays
        self._skip = skip = [ok and not h for ok, h in zip(live, hit)]
        keep = np.array(skip, dtype=bool)
        np.logical_not(keep, out=keep)
        return keep, keep

    def consumed(self, n: int) -> None:
        """The store looked at the first ``n`` units of the last select_units batch (bitmap counters,
        the backfill cursor): MessageFilter.consumed."""
        if self._backfill is not None:
            if self._ruled_out is not None:
                self._backfill.skipped += int(np.count_nonzero(self._ruled_out[:n]))
                self._ruled_out = None
            self._cursor += n
        m = self.metrics
        if m is not None and isinstance(self._skip, list):  # _select_sql_few's
            m.bitmap_skipped += sum(self._skip[:n])
            m.bitmap_hits += sum(self._hits[:n])  # type: ignore[index]
        elif m is not None and self._skip is not None:
            m.bitmap_skipped += int(np.count_nonzero(self._skip[:n]))
            m.bitmap_hits += int(np.count_nonzero(self._hits[:n]))  # type: ignore[index]

    def match_record(self, properties: dict[str, str]) -> bool:
        return self.match_record_at(-1, properties)

    def match_record_at(self, index: int, properties: dict[str, str]) -> bool:
        """MessageFilter.match_record_at: counts evaluations, errors and bitmap false positives."""
        if self._tag is not None:
            return self._tag.matches(properties)
        m = self.metrics
        if m is None:
            return self.selector.matches(properties)
        m.evaluated += 1
        try:
            ok = self.selector.evaluate(properties) is True
        except FilterEvaluationError as e:
            m.errors += 1
            m.last_error = str(e)
            ok = False
        if ok:
            m.matched += 1
        elif index >= 0 and self._hits is not None and self._hits[index]:
            m.bitmap_false_positives += 1
        return ok

    def judge(self, values: tuple[str | None, ...]) -> int:
        """MessageFilter.judge: the verdict on a record whose ``record_keys`` properties hold ``values``
        (None: absent): 1 TRUE, 0 FALSE or NULL, 2 + k an evaluation error (``_messages[k]``)."""
        sel = self.selector
        props = {k: v for k, v in zip(sel.properties, values) if v is not None}  # type: ignore[attr-defined]
        try:
            return 1 if sel.evaluate(props) is True else 0
        except FilterEvaluationError as e:
            self._messages.append(str(e))
            return len(self._messages) + 1

    def settle(self, indexes: np.ndarray, verdicts: np.ndarray) -> None:
        """MessageFilter.settle: the units ``indexes`` of the window were judged ``verdicts``; counted as
        match_record_at counts each record."""
        m = self.metrics
        if m is None or len(verdicts) == 0:
            return
        if len(verdicts) <= SMALL_BATCH:  # a woken pull's few: Python ints cost less than numpy's steps
            self._settle_few(m, indexes.tolist(), verdicts.tolist())
            return
        m.evaluated += len(verdicts)
        m.matched += int(np.count_nonzero(verdicts == 1))
        err = verdicts >= 2
        n_err = int(np.count_nonzero(err))
        if n_err:
            m.errors += n_err
            m.last_error = self._messages[int(verdicts[err][-1]) - 2]
        if self._hits is not None:
            m.bitmap_false_positives += int(np.count_nonzero(self._hits[indexes[verdicts != 1]]))

    def _settle_few(self, m, indexes: list[int], verdicts: list[int]) -> None:  # type: ignore[no-untyped-def]
        """settle's counts for a few verdicts, on Python ints (the same counts)."""
        m.evaluated += len(verdicts)
        m.matched += verdicts.count(1)
        errs = [v for v in verdicts if v >= 2]
        if errs:
            m.errors += len(errs)
            m.last_error = self._messages[errs[-1] - 2]
        hits = self._hits
        if hits is not None:
            m.bitmap_false_positives += sum(1 for i, v in zip(indexes, verdicts) if v != 1 and hits[i])

    def match_dispatch(self, tag_code: int, properties: dict[str, str]) -> bool:
        """Would a just-dispatched message pass? (wakes held pulls only for messages they want)."""
        if self._tag is not None:
            return self._tag.matches_code(tag_code)
        return self.selector.matches(properties)

    def dispatch_verdict(self, tag_code: int, properties: dict[str, str]) -> int:
        """:meth:`match_dispatch` for a held pull that may skip what it rules out: 1 the message passes; 0 it
        does not, for certain (a tag code not subscribed, a SQL92 FALSE or NULL: a pull would judge it the
        same); 2 it does not pass, but the pull must still read it (an evaluation error, which the pull
        reports in the metrics); 3 it passes now, but the pull judges it again (a verdict that may change)."""
        if self._tag is not None:
            return 1 if self._tag.matches_code(tag_code) else 0
        try:
            ok = self.selector.evaluate(properties) is True
        except FilterEvaluationError:
            return 2
        return 1 if ok else 0

    def judged_at_arrival(self) -> None:
        """The one unit a woken pull returns was judged a match by :meth:`dispatch_verdict` as it arrived, and
        the pull reads it without judging it again: counted in the metrics as the pull's evaluation would be."""
        m = self.metrics
        if m is not None and self._tag is None:
            m.evaluated += 1
            m.matched += 1

    def skipped_unread(self, n: int) -> None:
        """``n`` units :meth:`dispatch_verdict` ruled out were not read by the pull (its hold moved past
        them): counted in the metrics as the pull's own evaluations of them would have been."""
        m = self.metrics
        if m is not None and self._tag is None:
            m.evaluated += n

    @property
    def passes_all(self) -> bool:
        return self._tag is not None and self._tag.sub_all


@dataclass(frozen=True, slots=True)
class CompiledSubscription:
    """A subscription as the broker keeps it: the client's data plus the server-compiled filter."""

    topic: str
    expression_type: str
    expression: str
    sub_version: int
    tags: tuple[str, ...]
    filter: SelectorFilter

    def to_wire(self) -> dict:
        """SubscriptionData JSON, with tag codes recomputed on the server (Java hashes, as clients expect)."""
        from sluice.filter import java_string_hash
        class_mode = self.expression_type == CLASS_FILTER
        return {
            "topic": self.topic, "subString": self.expression, "classFilterMode": class_mode,
            "tagsSet": list(self.tags), "codeSet": [java_string_hash(t) for t in self.tags],
            "subVersion": self.sub_version, "expressionType": "TAG" if class_mode else self.expression_type,
        }


def compile_subscription(topic: str, expression_type: str | None, expression: str | None, sub_version: int,
                         *, enable_property_filter: bool) -> CompiledSubscription:
    """Compile what a client subscribed; SelectorSyntaxError (SUBSCRIPTION_PARSE_FAILED) on a bad expression.

    Tag codes are always recomputed from the expression: librocketmq sends ``codeSet: [0, 0]``.
    """
    etype = "TAG" if is_tag_type(expression_type) else str(expression_type).upper()
    if etype == "SQL92" and not enable_property_filter:
        raise SqlFilterDisabledError(SQL92_DISABLED)
    selector = compile_selector(etype, expression)
    tags = selector.tags if isinstance(selector, TagSelector) else ()
    return CompiledSubscription(topic, etype, selector.expression if etype == "TAG" else (expression or ""),
                                sub_version, tags, SelectorFilter(selector))


def class_subscription(topic: str, class_name: str | None, sub_version: int) -> CompiledSubscription:
    """A classFilterMode subscription (RocketMQ's subscribe(topic, fullClassName, source)): kept as
    ``CLASS`` + the class name, never compiled as a tag expression; SelectorSyntaxError
    (SUBSCRIPTION_PARSE_FAILED) without a class name."""
    name = (class_name or "").strip()
    if not name or name == "*" or len(name) > MAX_CLASS_NAME:
        raise SelectorSyntaxError(f"a class-filter subscription of topic {topic!r} needs a class name (subString, "
                                  f"at most {MAX_CLASS_NAME} characters), not {class_name!r}", expression=class_name)
    return CompiledSubscription(topic, CLASS_FILTER, name, sub_version, (), SelectorFilter(compile_selector("TAG",
                                                                                                         "*")))


def compile_subscription_data(sd: SubscriptionData, *, enable_property_filter: bool) -> CompiledSubscription:
    return compile_subscription(sd.topic, sd.expression_type, sd.sub_string, sd.sub_version,
                                enable_property_filter=enable_property_filter)
