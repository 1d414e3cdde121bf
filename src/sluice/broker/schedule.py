"""Delayed delivery: RocketMQ's delay levels, and delivery at any time (``deliver-at``) with 1 s precision.

Delay levels (ScheduleMessageService). A message with ``DELAY=n`` is stored
in ``SCHEDULE_TOPIC_XXXX`` queue ``n-1`` with its destination in REAL_TOPIC /
REAL_QID. Every message of a level queue has the same delay, so the queue is
due in store order: the service looks at each queue's head, and moves every
message whose ``store time + delay`` has passed to its real topic (DELAY
removed), then records the queue's progress.

Deliver-at (beyond RocketMQ 4.x). A message with TIMER_DELIVER_MS (epoch ms),
or TIMER_DELAY_MS / TIMER_DELAY_SEC (relative to the broker's clock when it
arrives), is stored in ``SLUICE_TIMER_XXXX``, a hierarchical timing wheel made
of 19 bucket queues: bucket 0 holds what is due within 1 s, bucket k≥1 what is
due in [2^(k-1), 2^k) s. A bucket-k message is looked at again ``hop(k) =
min(2^(k-1) s, max hop)`` after it was stored — never after it is due — and is
then delivered, or re-filed into the bucket of what remains (at least halving
it). As the look-again time grows with store order inside a bucket, each
bucket is served from its head like a level queue. So a pending message costs
nothing until its bucket's head reaches it, the service touches only due
heads (no scan of everything pending), and a message is rewritten about
log2(delay) times. Bucket 0 is served at the due time itself: a message is
never early and at most ~1 s (plus one tick) late. The max hop (24 h, or a
third of commit-log retention if that is shorter) keeps every pending message
younger than retention, so long delays survive segment deletion. Delays up to
``MAX_TIMER_DELAY_MS`` (400 days) are accepted; a deliver-at in the past is
delivered at once.

Progress (the next offset of each schedule queue) is persisted in
``{store}/config/delayOffset.json`` after every batch moved; the schedule
queues themselves are commit-log data, so both kinds survive broker restarts.
Crash window: a batch moved but not yet recorded is moved again after a
crash (at-least-once, never lost).
"""
from __future__ import annotations

import asyncio
import logging
import re
import time
from operator import attrgetter
from pathlib import Path

from sluice.broker.appender import Appender, stored
from sluice.broker.pool import BlockingPool
from sluice.broker.topics import DLQ_PREFIX, SCHEDULE_TOPIC, TopicConfig, TopicConfigManager
from sluice.errors import InvalidParameterError, MessageIllegalError, SluiceError
from sluice.persist import read_json, write_json_atomic
from sluice.protocol import properties as P
from sluice.protocol.record import RecordView, check_topic, iter_records
from sluice.store import MessageStore
from sluice.store.types import GetMessageStatus, StoreMessage

__all__ = ["MAX_TIMER_DELAY_MS", "TIMER_BUCKETS", "TIMER_TOPIC", "ScheduleService", "parse_delay_levels",
           "timer_bucket", "timer_hop_ms"]

log = logging.getLogger(__name__)

TIMER_TOPIC = "SLUICE_TIMER_XXXX"
#: Bucket 0: due within 1 s; bucket k: due in [2^(k-1), 2^k) s; the last bucket takes everything longer.
TIMER_BUCKETS = 19
#: Longest accepted deliver-at delay.
MAX_TIMER_DELAY_MS = 400 * 24 * 3600 * 1000
#: Longest time a pending timer message sits before it is rewritten.
MAX_HOP_MS = 24 * 3600 * 1000
#: The service looks at the queue heads this often (it sleeps less when a head falls due sooner).
TICK_S = 0.1
#: Messages moved per queue per read.
BATCH = 64
#: Property the delivered timer message keeps: when it was due (TIMER_DELIVER_MS itself is removed).
TIMER_OUT_MS = "TIMER_OUT_MS"

#: the properties that make a message delayed (a delay level, or a deliver-at / delay time)
_DELAY_NAMES = frozenset({P.DELAY, P.TIMER_DELIVER_MS, P.TIMER_DELAY_MS, P.TIMER_DELAY_SEC})
_properties_of = attrgetter("properties")
_UNITS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}
_LEVEL_RE = re.compile(r"^(\d+)(ms|s|m|h|d)$")


def parse_delay_levels(text: str) -> list[int]:
    """``"1s 5s 10s 30s 1m ... 2h"`` (messageDelayLevel; units ms s m h d) to milliseconds per level."""
    out = []
    for item in text.split():
        m = _LEVEL_RE.match(item.strip().lower())
        if not m:
            raise InvalidParameterError(f"message_delay_level: {item!r} is not a number with a unit (ms s m h d)")
        out.append(int(m.group(1)) * _UNITS[m.group(2)])
    if not out:
        raise InvalidParameterError("message_delay_level names no level")
    return out


def timer_bucket(remaining_ms: int) -> int:
    """The bucket of a timer message due in ``remaining_ms``: 0 below 1 s, else floor(log2(seconds)) + 1
    (capped at the last bucket), so bucket k holds [2^(k-1), 2^k) s."""
    if remaining_ms < 1000:
        return 0
    return min((remaining_ms // 1000).bit_length(), TIMER_BUCKETS - 1)


def timer_hop_ms(bucket: int, max_hop_ms: int = MAX_HOP_MS) -> int:
    """How long after it was stored a bucket-``bucket`` message is looked at again (bucket 0: at its due time,
    which the caller applies)."""
    return 0 if bucket <= 0 else min(1000 << (bucket - 1), max_hop_ms)


class ScheduleService:
    """Diverts delayed messages on arrival (:meth:`divert`) and moves them when due (a loop task)."""

    def __init__(self, config_dir: Path, *, message_delay_level: str, retention_hours: float, store: MessageStore,
                 pool: BlockingPool, topics: TopicConfigManager, appender: Appender) -> None:
        self.store = store  # read only: the schedule queues (moves go through the appender)
        self.pool = pool
        self.topics = topics
        self.appender = appender
        self.levels = parse_delay_levels(message_delay_level)
        self.max_hop_ms = int(min(MAX_HOP_MS, retention_hours * 3600 * 1000 / 3))
        self._path = config_dir / "delayOffset.json"
        self.offsets: dict[tuple[str, int], int] = {}
        self._heads: dict[tuple[str, int], tuple[int, int]] = {}  # queue -> (head offset, due ms)
        self._dirty = False
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self.delivered = 0
        self.refiled = 0
        doc = read_json(self._path, default={}) or {}
        for topic, queues in (doc.get("offsetTable") or {}).items():
            for qid, off in queues.items():
                self.offsets[(topic, int(qid))] = int(off)
        self._ensure_topics()

    def _ensure_topics(self) -> None:
        topics = self.topics
        n = len(self.levels)
        cfg = topics.get(SCHEDULE_TOPIC)
        if cfg is None or cfg.read_queue_nums != n:
            topics.update(TopicConfig(SCHEDULE_TOPIC, n, n, cfg.perm if cfg else 6))

    @property
    def queues(self) -> list[tuple[str, int]]:
        return [(SCHEDULE_TOPIC, i) for i in range(len(self.levels))] + \
               [(TIMER_TOPIC, k) for k in range(TIMER_BUCKETS)]

    # ------------------------------------------------------------------------------ on arrival

    def divert(self, msgs: list[StoreMessage], now_ms: int | None = None) -> None:
        """Redirect delayed messages (in place) to their schedule queue; others are left alone."""
        if all(map(_DELAY_NAMES.isdisjoint, map(_properties_of, msgs))):
            return  # the usual send: one C-level pass over the batch
        now = int(time.time() * 1000) if now_ms is None else now_ms
        for m in msgs:
            props = m.properties
            timer = P.TIMER_DELIVER_MS in props or P.TIMER_DELAY_MS in props or P.TIMER_DELAY_SEC in props
            level = props.get(P.DELAY)
            if not timer and not level:
                continue
            if m.topic.startswith(DLQ_PREFIX):  # dead letters are never delayed
                for k in (P.DELAY, P.TIMER_DELIVER_MS, P.TIMER_DELAY_MS, P.TIMER_DELAY_SEC):
                    props.pop(k, None)
                continue
            if len(msgs) > 1:
                raise MessageIllegalError("delayed messages cannot be sent in a batch")
            if timer:
                if level:
                    raise MessageIllegalError("a message has either a delay level or a deliver-at time, not both")
                self._divert_timer(m, self._due_ms(props, now), now)
            else:
                self._divert_level(m, level)

    def _due_ms(self, props: dict[str, str], now: int) -> int:
        try:
            if P.TIMER_DELIVER_MS in props:
                due = int(props.pop(P.TIMER_DELIVER_MS))
                relative = None
            elif P.TIMER_DELAY_MS in props:
                relative = int(props[P.TIMER_DELAY_MS])
            else:
                relative = int(props[P.TIMER_DELAY_SEC]) * 1000
        except ValueError:
            raise MessageIllegalError("TIMER_DELIVER_MS / TIMER_DELAY_MS / TIMER_DELAY_SEC must be integers") from None
        props.pop(P.TIMER_DELAY_MS, None)
        props.pop(P.TIMER_DELAY_SEC, None)
        if relative is not None:
            if relative < 0:
                raise MessageIllegalError(f"a relative delay must be >= 0, got {relative} ms")
            due = now + relative
        if due < 0:
            raise MessageIllegalError(f"deliver-at time {due} is not a valid epoch millisecond")
        if due - now > MAX_TIMER_DELAY_MS:
            raise MessageIllegalError(f"deliver-at is {(due - now) / 86_400_000:.1f} days away; the maximum is "
                                      f"{MAX_TIMER_DELAY_MS // 86_400_000} days")
        return due

    def _divert_timer(self, m: StoreMessage, due: int, now: int) -> None:
        if due <= now:
            m.properties[TIMER_OUT_MS] = str(due)  # already due: delivered at once
            return
        m.properties[P.TIMER_DELIVER_MS] = str(due)
        m.properties[P.REAL_TOPIC] = m.topic
        m.properties[P.REAL_QID] = str(m.queue_id)
        m.topic, m.queue_id = TIMER_TOPIC, timer_bucket(due - now)
        self._wake.set()

    def _divert_level(self, m: StoreMessage, level_text: str) -> None:
        try:
            level = int(level_text)
        except ValueError:
            raise MessageIllegalError(f"DELAY must be an integer delay level, got {level_text!r}") from None
        if level <= 0:
            m.properties.pop(P.DELAY, None)
            return
        level = min(level, len(self.levels))  # RocketMQ caps at the last level
        m.properties[P.DELAY] = str(level)
        m.properties[P.REAL_TOPIC] = m.topic
        m.properties[P.REAL_QID] = str(m.queue_id)
        m.topic, m.queue_id = SCHEDULE_TOPIC, level - 1
        self._wake.set()

    # ------------------------------------------------------------------------------ the service

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name="schedule")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None
        self.persist()

    def persist(self) -> None:
        table: dict[str, dict[str, int]] = {}
        for (topic, qid), off in sorted(self.offsets.items()):
            table.setdefault(topic, {})[str(qid)] = off
        write_json_atomic(self._path, {"offsetTable": table})
        self._dirty = False

    def stats(self) -> dict[str, int]:
        """Messages waiting (not yet moved) per kind, and counters."""
        store = self.store
        waiting = {SCHEDULE_TOPIC: 0, TIMER_TOPIC: 0}
        for topic, qid in self.queues:
            waiting[topic] += max(0, store.get_max_offset(topic, qid) - self.offsets.get((topic, qid), 0))
        return {"scheduleWaiting": waiting[SCHEDULE_TOPIC], "timerWaiting": waiting[TIMER_TOPIC],
                "scheduleDelivered": self.delivered, "timerRefiled": self.refiled}

    async def _run(self) -> None:
        while True:
            sleep = TICK_S
            try:
                now = int(time.time() * 1000)
                for q in self.queues:
                    for _ in range(32):  # a backlog moves up to 32 batches per queue per tick
                        if not await self._serve(q, now):
                            break
                if self._dirty:
                    await self.pool.run(self.persist)
                heads = [due for _, due in self._heads.values()]
                if heads:
                    sleep = max(0.0, min(TICK_S, (min(heads) - time.time() * 1000) / 1000))
            except asyncio.CancelledError:
                raise
            except Exception:  # keep delivering; the next tick retries from the recorded progress
                log.exception("schedule service tick failed")
                sleep = 1.0
            self._wake.clear()
            try:
                await asyncio.wait_for(self._wake.wait(), sleep)
            except TimeoutError:
                pass

    def _look_again_ms(self, topic: str, qid: int, rec: RecordView, props: dict[str, str]) -> int:
        if topic == SCHEDULE_TOPIC:
            return rec.store_timestamp + self.levels[min(qid, len(self.levels) - 1)]
        due = int(props.get(P.TIMER_DELIVER_MS, "0") or 0)
        if qid == 0:
            return due
        return min(due, rec.store_timestamp + timer_hop_ms(qid, self.max_hop_ms))

    async def _serve(self, q: tuple[str, int], now: int) -> bool:
        """Move the queue's due head messages; True when a whole batch moved (there may be more)."""
        topic, qid = q
        store = self.store
        off = self.offsets.get(q, 0)
        head = self._heads.get(q)
        if head is not None and head[0] == off and head[1] > now:
            return False
        hi = store.get_max_offset(topic, qid)
        if hi <= off:
            self._heads.pop(q, None)
            if hi < off:  # the store lost its tail in a crash: go on from what exists
                log.warning("schedule queue %s/%d: progress %d beyond the queue end %d", topic, qid, off, hi)
                self.offsets[q] = hi
                self._dirty = True
            return False
        res = await self.pool.run(store.get_messages, topic, qid, off, BATCH)
        if res.status is not GetMessageStatus.FOUND:
            if res.next_begin_offset != off and res.status is not GetMessageStatus.OFFSET_FOUND_NULL:
                log.warning("schedule queue %s/%d: %s at %d, going on at %d", topic, qid, res.status.name, off,
                            res.next_begin_offset)
                self.offsets[q] = res.next_begin_offset
                self._dirty = True
            return False
        out: list[StoreMessage] = []
        last = off - 1  # the last queue offset handled (moved, or dropped as unreadable)
        self._heads.pop(q, None)
        for rec, qoff in zip(iter_records(res.data, check_crc=False), res.queue_offsets):
            props = P.decode_properties(rec.properties)
            when = self._look_again_ms(topic, qid, rec, props)
            if when > now:
                self._heads[q] = (qoff, when)
                break
            nxt = self._next_hop(topic, rec, props, now)
            if nxt is not None:
                out.append(nxt)
            last = qoff
        if last < off:
            return False
        try:
            await self._put_in_order(out)
        except SluiceError as exc:
            log.warning("moving due messages of %s/%d failed (retrying): %s", topic, qid, exc)
            return False
        self.offsets[q] = last + 1
        self._dirty = True
        return q not in self._heads and last - off + 1 >= BATCH

    def _next_hop(self, topic: str, rec: RecordView, props: dict[str, str], now: int) -> StoreMessage | None:
        def msg(to_topic: str, to_qid: int) -> StoreMessage:
            return StoreMessage(to_topic, rec.body, to_qid, props, rec.flag, rec.sysflag, rec.born_timestamp,
                                rec.born_host, rec.reconsume_times)
        if topic == TIMER_TOPIC:
            due = int(props.get(P.TIMER_DELIVER_MS, "0") or 0)
            if due > now:  # not due yet: into the bucket of what remains (bucket 0 waits for the due time)
                self.refiled += 1
                return msg(TIMER_TOPIC, timer_bucket(due - now))
            props.pop(P.TIMER_DELIVER_MS, None)
            props[TIMER_OUT_MS] = str(due)
        else:
            props.pop(P.DELAY, None)
        self.delivered += 1
        real = props.get(P.REAL_TOPIC, "")
        try:
            real_qid = int(props.get(P.REAL_QID, "0"))
            check_topic(real)
        except (ValueError, MessageIllegalError):
            # Only a foreign writer can store this; dropping it beats blocking the queue behind it.
            log.error("schedule record at commit-log offset %d has no valid REAL_TOPIC/REAL_QID; dropped",
                      rec.physical_offset)
            return None
        return msg(real, real_qid)

    async def _put_in_order(self, msgs: list[StoreMessage]) -> None:
        """Append runs of messages for the same queue together, in order."""
        run: list[StoreMessage] = []
        for m in msgs:
            if run and (m.topic, m.queue_id) != (run[0].topic, run[0].queue_id):
                await stored(self.appender.put(run[0].topic, run[0].queue_id, run))
                run = []
            run.append(m)
        if run:
            await stored(self.appender.put(run[0].topic, run[0].queue_id, run))
