"""Consumer filter data (RocketMQ's ConsumerFilterManager), persisted and restored across restarts.

Per topic and group: the expression, its type, the subscription version
(``subVersion``), born and dead time, and for SQL92 the Bloom bits of
``group#topic``. Registered from every heartbeat with RocketMQ's rules
(broker/src/main/java/org/apache/rocketmq/broker/filter/ConsumerFilterManager.java):
an older or equal version never replaces a newer one, a newer one with a
changed expression rebuilds the entry (new born time), a group's topics it no
longer subscribes are marked dead, a group whose last member left is marked
dead, and dead data goes after ``filter_data_clean_time_span_ms``.

Departures from RocketMQ, on purpose:

* TAG subscriptions are kept too (without Bloom data), so a consumer that
  pulls without its subscription after a broker restart still gets filtered
  messages.
* Restoring never drops the table. If the Bloom sizing changed, each SQL92
  entry gets new Bloom data and a new born time, so bitmaps written under the
  old sizing are not trusted (those messages are evaluated directly).
* An entry that no longer compiles (e.g. tighter limits) is kept, with its
  compile error: pulls relying on it are refused with that error, never served
  everything.

The dispatch thread reads :meth:`sql_filters` (an immutable snapshot replaced
on every change); everything else runs on the broker's event loop, except the
compilation of restored expressions: the broker runs :meth:`compile_restored` on
the selector compile thread (selector_compile.py) before its store recovers and
its port opens, so many long SQL92 expressions never hold the loop.
"""
from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

from sluice.errors import FilterError
from sluice.filter import BloomFilter, BloomFilterData, Selector, compile_selector
from sluice.persist import read_json, write_json_atomic

__all__ = ["ConsumerFilterData", "ConsumerFilterManager", "FilterMetrics", "LIVE_MARGIN_MS", "NOT_COMPILED"]

log = logging.getLogger(__name__)

#: A message counts as stored after its filter data was born (so its bitmap holds that consumer's
#: bits) only when its store time is this much past the born time: covers the moment between taking
#: the born time and the dispatch thread seeing the new entry. Earlier messages are evaluated directly.
LIVE_MARGIN_MS = 1000
FILE_NAME = "consumerFilter.json"
#: The ``error`` of a restored entry whose expression is not compiled yet (pulls relying on it are refused).
NOT_COMPILED = "not compiled yet: the broker is starting"


def _now_ms() -> int:
    return int(time.time() * 1000)


@dataclass(slots=True)
class FilterMetrics:
    """Per group and topic: what the filter did on pulls."""

    evaluated: int = 0
    matched: int = 0
    errors: int = 0
    bitmap_skipped: int = 0
    bitmap_hits: int = 0
    bitmap_false_positives: int = 0
    last_error: str | None = None

    def to_wire(self) -> dict[str, object]:
        return {"evaluated": self.evaluated, "matched": self.matched, "errors": self.errors,
                "bitmapSkipped": self.bitmap_skipped, "bitmapHits": self.bitmap_hits,
                "bitmapFalsePositives": self.bitmap_false_positives, "lastError": self.last_error}


@dataclass(slots=True)
class ConsumerFilterData:
    group: str
    topic: str
    expression: str
    expression_type: str
    client_version: int
    born_time: int
    dead_time: int = 0
    bloom: BloomFilterData | None = None
    selector: Selector | None = field(default=None, compare=False)
    #: Why the expression does not compile (restored entries only; registration refuses such data).
    error: str | None = None

    @property
    def is_dead(self) -> bool:
        return self.dead_time >= self.born_time

    @property
    def is_sql(self) -> bool:
        return self.expression_type != "TAG"

    def to_json(self) -> dict[str, object]:
        return {"consumerGroup": self.group, "topic": self.topic, "expression": self.expression,
                "expressionType": self.expression_type, "clientVersion": self.client_version,
                "bornTime": self.born_time, "deadTime": self.dead_time,
                "bloomFilterData": None if self.bloom is None else self.bloom.to_json()}

    def describe(self) -> dict[str, object]:
        d = self.to_json()
        d["dead"] = self.is_dead
        d["error"] = self.error
        return d


@dataclass(frozen=True, slots=True)
class SqlFilterEntry:
    """What the bitmap dispatcher needs of one live SQL92 filter."""

    group: str
    selector: Selector
    bloom: BloomFilterData


class ConsumerFilterManager:
    def __init__(self, config_dir: Path | None, *, bloom: BloomFilter | None, clean_span_ms: int = 24 * 3600 * 1000,
                 clock: Callable[[], int] = _now_ms) -> None:
        self.path = None if config_dir is None else Path(config_dir) / FILE_NAME
        self.bloom = bloom
        self.clean_span_ms = clean_span_ms
        self._clock = clock
        self.table: dict[str, dict[str, ConsumerFilterData]] = {}  # topic -> group -> data
        #: group -> the topics it has data on in ``table``: a heartbeat looks at its group's topics alone,
        #: not at every topic of the broker (kept with ``table`` by _put and _drop)
        self._topics_of: dict[str, set[str]] = {}
        self.metrics: dict[tuple[str, str], FilterMetrics] = {}
        self._sql: dict[str, tuple[SqlFilterEntry, ...]] = {}
        self._dirty = False

    # ---- registration ------------------------------------------------------------------------------
    def register(self, topic: str, group: str, expression: str, expression_type: str, client_version: int,
                 selector: Selector | None = None) -> bool:
        """RocketMQ's register(topic, group, ...): True when the entry was created, rebuilt or revived."""
        etype = expression_type.upper() if expression_type else "TAG"
        if not expression:
            return False
        old = self.get(topic, group)
        if old is not None and client_version <= old.client_version:
            if (old.expression, old.expression_type) != (expression, etype):
                log.warning("ignoring an older subscription of group %s on %s (version %d <= %d): %s %r; "
                            "keeping %s %r", group, topic, client_version, old.client_version, etype, expression,
                            old.expression_type, old.expression)
            if client_version == old.client_version and old.is_dead:
                old.dead_time = 0
                self._changed(topic)
                return True
            return False
        if old is not None and (old.expression, old.expression_type) == (expression, etype) \
                and old.error is None and self._bloom_ok(old):
            old.client_version = client_version
            old.dead_time = 0 if old.is_dead else old.dead_time
            self._changed(topic)
            return True
        try:
            data = self._build(topic, group, expression, etype, client_version, selector)
        except FilterError as e:
            log.error("filter data of group %s on %s not registered: %s", group, topic, e)
            if old is not None:
                self._drop(topic, group)
                self._changed(topic)
            return False
        self._put(topic, group, data)
        self._changed(topic)
        return True

    def _put(self, topic: str, group: str, data: ConsumerFilterData) -> None:
        self.table.setdefault(topic, {})[group] = data
        self._topics_of.setdefault(group, set()).add(topic)

    def _drop(self, topic: str, group: str) -> None:
        by_group = self.table[topic]
        del by_group[group]
        if not by_group:
            del self.table[topic]
        topics = self._topics_of[group]
        topics.discard(topic)
        if not topics:
            del self._topics_of[group]

    def _build(self, topic: str, group: str, expression: str, etype: str, version: int,
               selector: Selector | None) -> ConsumerFilterData:
        selector = selector or compile_selector(etype, expression)
        bloom = self.bloom.generate(f"{group}#{topic}") if self.bloom is not None and etype != "TAG" else None
        return ConsumerFilterData(group, topic, expression, etype, version, self._clock(), 0, bloom, selector)

    def _bloom_ok(self, d: ConsumerFilterData) -> bool:
        if not d.is_sql or self.bloom is None:
            return True
        return self.bloom.is_valid(d.bloom)

    def register_group(self, group: str, subscriptions: Iterable[tuple[str, str, str, int, Selector | None]]) -> None:
        """A heartbeat: register each (topic, type, expression, version, compiled) and mark the group's
        other topics dead (RocketMQ's register(group, subscriptions))."""
        topics = set()
        for topic, etype, expression, version, selector in subscriptions:
            topics.add(topic)
            self.register(topic, group, expression, etype, version, selector)
        now = self._clock()
        for topic in self._topics_of.get(group, set()) - topics:
            d = self.table[topic][group]
            if not d.is_dead:
                d.dead_time = now
                self._changed(topic)

    def unregister(self, group: str) -> None:
        """The group's last member left: its data is dead (kept for filtering and bitmaps until cleaned)."""
        now = self._clock()
        for topic in list(self._topics_of.get(group, ())):
            d = self.table[topic][group]
            if not d.is_dead:
                d.dead_time = now
                self._changed(topic)

    def _changed(self, topic: str | None = None) -> None:
        """Mark the data dirty and rebuild the SQL92 snapshot the dispatch thread reads: only ``topic``'s
        entries when one topic changed (a heartbeat's registration then costs the same however many groups
        the broker has), else every topic's."""
        self._dirty = True
        if topic is None:
            snap: dict[str, tuple[SqlFilterEntry, ...]] = {}
            for t, by_group in self.table.items():
                entries = self._sql_entries(by_group)
                if entries:
                    snap[t] = entries
        else:
            snap = dict(self._sql)
            entries = self._sql_entries(self.table.get(topic, {}))
            if entries:
                snap[topic] = entries
            else:
                snap.pop(topic, None)
        self._sql = snap  # one reference swap: the dispatch thread never sees a half-built table

    def _sql_entries(self, by_group: dict[str, ConsumerFilterData]) -> tuple[SqlFilterEntry, ...]:
        return tuple(SqlFilterEntry(d.group, d.selector, d.bloom) for d in by_group.values()
                     if d.is_sql and d.selector is not None and d.bloom is not None and self._bloom_ok(d))

    # ---- lookups -----------------------------------------------------------------------------------
    def get(self, topic: str, group: str) -> ConsumerFilterData | None:
        by_group = self.table.get(topic)
        return None if by_group is None else by_group.get(group)

    def sql_filters(self, topic: str) -> tuple[SqlFilterEntry, ...]:
        """Every SQL92 filter of ``topic`` with Bloom data, dead ones included (as RocketMQ's dispatcher)."""
        return self._sql.get(topic, ())

    def sql_topics(self) -> dict[str, tuple[SqlFilterEntry, ...]]:
        return self._sql

    def metrics_of(self, group: str, topic: str) -> FilterMetrics:
        m = self.metrics.get((group, topic))
        if m is None:
            m = self.metrics[(group, topic)] = FilterMetrics()
        return m

    def totals(self) -> dict[str, int]:
        out = {"filterEvaluated": 0, "filterMatched": 0, "filterErrors": 0, "filterBitmapSkipped": 0,
               "filterBitmapFalsePositives": 0}
        for m in self.metrics.values():
            out["filterEvaluated"] += m.evaluated
            out["filterMatched"] += m.matched
            out["filterErrors"] += m.errors
            out["filterBitmapSkipped"] += m.bitmap_skipped
            out["filterBitmapFalsePositives"] += m.bitmap_false_positives
        out["filterDataEntries"] = sum(len(g) for g in self.table.values())
        out["filterSqlTopics"] = len(self._sql)
        return out

    # ---- cleaning and persistence ------------------------------------------------------------------
    def clean(self) -> int:
        """Remove entries dead for longer than the clean span; returns how many went."""
        now = self._clock()
        gone = 0
        for topic in list(self.table):
            for group in [g for g, d in self.table[topic].items()
                          if d.is_dead and now - d.dead_time >= self.clean_span_ms]:
                self._drop(topic, group)
                gone += 1
        if gone:
            self._changed()
        return gone

    def encode(self) -> dict[str, object]:
        self.clean()
        return {"filterDataByTopic": {topic: {"topic": topic, "groupFilterData": {
            g: d.to_json() for g, d in sorted(by_group.items())}} for topic, by_group in sorted(self.table.items())}}

    def take_snapshot(self, *, force: bool = False) -> dict[str, object] | None:
        """The document to persist, or None when nothing changed (call on the thread that mutates)."""
        if self.path is None or not (self._dirty or force):
            return None
        self._dirty = False
        return self.encode()

    def write(self, doc: dict[str, object]) -> None:
        """Write a snapshot to {store}/config/consumerFilter.json atomically (any thread)."""
        assert self.path is not None
        try:
            write_json_atomic(self.path, doc)
        except BaseException:
            self._dirty = True
            raise

    def persist(self, *, force: bool = False) -> bool:
        doc = self.take_snapshot(force=force)
        if doc is None:
            return False
        self.write(doc)
        return True

    def load(self, *, compile: bool = True) -> int:
        """Restore persisted entries; returns how many. Entries that were alive come back dead since
        ``now - 30 s`` (as RocketMQ) until their group's next heartbeat revives them.

        With ``compile`` false the expressions are left uncompiled (``selector`` None, ``error``
        :data:`NOT_COMPILED`): the broker compiles them off its event loop with :meth:`compile_restored`
        and installs the results with :meth:`install_compiled` before its store and port open."""
        if self.path is None:
            return 0
        doc = read_json(self.path, {}) or {}
        now = self._clock()
        count = 0
        try:
            topics = doc.get("filterDataByTopic", {})
            for topic, body in topics.items():
                for group, raw in (body.get("groupFilterData") or {}).items():
                    d = self._restore(topic, group, raw, now)
                    if d is not None:
                        self._put(topic, group, d)
                        count += 1
        except (AttributeError, TypeError, ValueError) as e:
            log.error("%s is not consumer filter data (%s); starting without it", self.path, e)
        if compile:
            self.install_compiled(self.compile_restored())
        else:
            self._changed()
        self._dirty = False
        if count:
            log.info("restored %d consumer filter entries from %s", count, self.path)
        return count

    def compile_restored(self) -> list[tuple[ConsumerFilterData, Selector | FilterError]]:
        """Compile every restored entry still uncompiled; touches no state, so it may run on any thread
        (a store holding many long SQL92 expressions would otherwise hold the event loop). Each distinct
        (type, expression) is compiled once."""
        done: dict[tuple[str, str], Selector | FilterError] = {}
        out = []
        for by_group in list(self.table.values()):
            for d in list(by_group.values()):
                if d.selector is not None or d.error != NOT_COMPILED:
                    continue
                key = (d.expression_type, d.expression)
                result = done.get(key)
                if result is None:
                    try:
                        result = compile_selector(d.expression_type, d.expression)
                    except FilterError as e:
                        result = e.with_traceback(None)
                    done[key] = result
                out.append((d, result))
        return out

    def install_compiled(self, results: Iterable[tuple[ConsumerFilterData, Selector | FilterError]]) -> None:
        """Put :meth:`compile_restored`'s results in place (on the loop: cheap) and rebuild the snapshot."""
        for d, result in results:
            if d.selector is not None or d.error != NOT_COMPILED:
                continue  # replaced meanwhile (a heartbeat's registration compiled it itself)
            if isinstance(result, FilterError):
                d.error = str(result)
                log.error("restored filter data of group %s on %s does not compile: %s", d.group, d.topic, result)
            else:
                d.selector, d.error = result, None
        dirty = self._dirty
        self._changed()
        self._dirty = dirty

    def _restore(self, topic: str, group: str, raw: dict, now: int) -> ConsumerFilterData | None:
        etype = str(raw.get("expressionType") or "TAG").upper()
        expression = raw.get("expression")
        if not isinstance(expression, str) or not expression:
            return None
        born = int(raw.get("bornTime") or 0)
        dead = int(raw.get("deadTime") or 0)
        bloom_raw = raw.get("bloomFilterData")
        bloom = BloomFilterData.from_json(bloom_raw) if isinstance(bloom_raw, dict) else None
        d = ConsumerFilterData(group, topic, expression, etype, int(raw.get("clientVersion") or 0), born, dead, bloom,
                               error=NOT_COMPILED)  # compile_restored compiles it
        if d.is_sql and self.bloom is not None and not self.bloom.is_valid(bloom):
            # Sizing changed: new bits, and a new born time so old bitmaps are not read with them.
            d.bloom = self.bloom.generate(f"{group}#{topic}")
            d.born_time = now
            d.dead_time = 0
        if d.dead_time == 0:
            d.dead_time = max(now - 30_000, d.born_time)
        return d
