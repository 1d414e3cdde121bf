"""A class-filter pull, forwarded to the broker and answered with what the class kept (the filter server's
PULL_MESSAGE; RocketMQ's pullMessageForward in
filtersrv/src/main/java/org/apache/rocketmq/filtersrv/processor/DefaultRequestProcessor.java).

* The pull goes to the broker as a plain ``*`` subscription pull of the group (the
  consumer's commitOffset forwarded with the commit flag on the first broker pull only,
  so the group's offsets are the broker's; long polling as the consumer asked, only
  while nothing is kept yet). The class runs on each batch in its worker.
* The answer is filled: broker pulls go on from each batch's nextBeginOffset until the
  class kept what the consumer asked for, the queue's end, ``MAX_EMPTY_ROUNDS`` broker
  pulls or the pull's time (RocketMQ answers after one broker pull; at 1 % selectivity
  that is a consumer round trip per two or three messages).
* How much is asked of the broker follows the class's measured selectivity (per
  topic@group): enough for what is still wanted with a margin, at most ``MAX_FETCH``;
  unknown yet, ``OVERFETCH`` times what is wanted; nothing kept so far in this pull,
  ``MAX_FETCH``.
* When the kept records exceed what was asked, the answer is cut there and its
  nextBeginOffset is the queue offset of the first kept record left out (filtered-out
  records before it are not read again); otherwise it is the nextBeginOffset of the
  last batch filtered. Offsets never pass a record the class did not see.
* Read-ahead: kept records beyond what was asked are kept (per topic, group and
  queue, for the class that filtered them) with the offset their batch ended at;
  the next pull at the first of them is answered from them (its commitOffset sent
  to the broker as UPDATE_CONSUMER_OFFSET) and filled on from that end offset, so
  consecutive pulls read each record once. Any other offset, a replaced class or
  an entry older than ``AHEAD_TTL_S`` misses; ``AHEAD_BYTES`` bounds them all.
* A fill that kept nothing answers PULL_RETRY_IMMEDIATELY (never FOUND with nothing:
  RocketMQ clients cannot take that) with nextBeginOffset past the skipped records, or
  the broker's PULL_NOT_FOUND at the queue's end, its nextBeginOffset likewise past them.
* The class failing answers SYSTEM_ERROR (FilterClassFailedError) with no
  nextBeginOffset when nothing was kept yet (the consumer pulls the same offset again);
  records kept by earlier batches of the fill are answered first, with nextBeginOffset
  at the failed batch, whose pull then gets the error.
"""
from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass

from sluice.client.broker_api import BrokerAPI
from sluice.errors import FilterClassError, SluiceError
from sluice.format import POS_QUEUEOFFSET
from sluice.filtersrv.registry import ClassEntry, FilterClassRegistry, FilterOutcome
from sluice.filtersrv.sandbox import split_records
from sluice.protocol.bodies import MessageQueue
from sluice.protocol.codes import RequestCode, ResponseCode
from sluice.protocol.command import RemotingCommand
from sluice.protocol.headers import PullMessageRequestHeader
from sluice.transport.client import RemotingClient

__all__ = ["PullForwarder", "FLAG_CLASS_FILTER", "MAX_EMPTY_ROUNDS", "MAX_FETCH", "OVERFETCH", "queue_offset_of",
           "fetch_size"]

# PullSysFlag (common/src/main/java/org/apache/rocketmq/common/sysflag/PullSysFlag.java)
from sluice.protocol.headers import (  # noqa: E402
    FLAG_CLASS_FILTER, FLAG_COMMIT_OFFSET, FLAG_SUBSCRIPTION, FLAG_SUSPEND,
)
#: Broker pulls one consumer pull may make.
MAX_EMPTY_ROUNDS = 8
#: Messages asked of the broker per message wanted while the class's selectivity is not known yet.
OVERFETCH = 8
#: The most messages asked of the broker at once (a Sluice broker's max_transfer_count default).
MAX_FETCH = 1024
#: Pulls' worth of kept records asked of the broker at once (the selectivity's estimate): the excess is
#: read ahead for the queue's next pulls, so a larger batch costs no re-reading.
FETCH_MARGIN = 4.0
#: Weight of the newest batch in a class's selectivity estimate.
SELECTIVITY_WEIGHT = 0.3
#: Selectivity estimates kept at most (one per topic@group; cleared whole past it).
MAX_ESTIMATES = 4096
#: Bytes of kept records one answer carries at most when the pull names no maxMsgBytes (filling takes several
#: broker answers; the remoting frame limit is 16 MiB).
ANSWER_BYTES = 4 * 1024 * 1024
#: Kept records read ahead, in all (the oldest queue's dropped past it).
AHEAD_BYTES = 64 * 1024 * 1024
#: A queue's read-ahead unused this long is dropped (its consumer went away or was rebalanced).
AHEAD_TTL_S = 30.0
#: Time a broker pull may take beyond the suspend time it asks for.
BROKER_PULL_SLACK_S = 5.0
log = logging.getLogger(__name__)

_PULL_FIELDS = ("suggestWhichBrokerId", "nextBeginOffset", "minOffset", "maxOffset")


def queue_offset_of(record: memoryview) -> int:
    """The queue offset a stored record carries (format.POS_QUEUEOFFSET)."""
    return int.from_bytes(record[POS_QUEUEOFFSET:POS_QUEUEOFFSET + 8], "big", signed=True)


def fetch_size(need: int, selectivity: float | None) -> int:
    """Messages to ask of the broker for ``need`` more kept ones at ``selectivity`` (None: not known)."""
    if selectivity is None:
        return min(MAX_FETCH, need * OVERFETCH)
    if selectivity <= 0.0:
        return MAX_FETCH
    return min(MAX_FETCH, max(need, math.ceil(need * FETCH_MARGIN / selectivity)))


@dataclass(slots=True)
class _Ahead:
    entry: ClassEntry  # the class that filtered them: a replaced class decides afresh
    records: list[memoryview]  # kept, in queue order, over one copied blob
    end: int  # where the broker pulls on: every record in [records[0]'s offset, end) was filtered
    fields: dict[str, str]
    size: int
    at: float


class ReadAhead:
    """Kept records beyond a pull's answer, per (topic, group, queue), bounded in bytes and age."""

    def __init__(self, max_bytes: int = AHEAD_BYTES, ttl_s: float = AHEAD_TTL_S) -> None:
        self.max_bytes, self.ttl_s = max_bytes, ttl_s
        self._by_queue: dict[tuple[str, str, int], _Ahead] = {}
        self.bytes = 0

    def __len__(self) -> int:
        return len(self._by_queue)

    def take(self, key: tuple[str, str, int], entry: ClassEntry, offset: int) -> _Ahead | None:
        """The read-ahead starting exactly at ``offset`` for ``entry``'s class, removed; None otherwise."""
        ahead = self._by_queue.pop(key, None)
        if ahead is None:
            return None
        self.bytes -= ahead.size
        if (ahead.entry is not entry or time.monotonic() - ahead.at > self.ttl_s
                or queue_offset_of(ahead.records[0]) != offset):
            return None
        return ahead

    def put(self, key: tuple[str, str, int], entry: ClassEntry, records: list[memoryview], end: int,
            fields: dict[str, str]) -> None:
        blob = b"".join(records)  # a copy: the batches they came from are not held
        if len(blob) > self.max_bytes:
            return
        old = self._by_queue.pop(key, None)
        if old is not None:
            self.bytes -= old.size
        now = time.monotonic()
        while self._by_queue and now - next(iter(self._by_queue.values())).at > self.ttl_s:  # oldest first
            self.bytes -= self._by_queue.pop(next(iter(self._by_queue))).size
        while self._by_queue and self.bytes + len(blob) > self.max_bytes:
            self.bytes -= self._by_queue.pop(next(iter(self._by_queue))).size
        self._by_queue[key] = _Ahead(entry, split_records(blob), end, fields, len(blob), now)
        self.bytes += len(blob)


class PullForwarder:
    """Serves class-filter pulls of the groups registered in ``registry`` from ``broker``."""

    def __init__(self, registry: FilterClassRegistry, remoting: RemotingClient, broker: str) -> None:
        self.registry = registry
        self.remoting = remoting
        self.api = BrokerAPI(remoting)
        self.broker = broker
        self._selectivity: dict[tuple[str, str], float] = {}
        self.ahead = ReadAhead()

    async def pull(self, request: RemotingCommand) -> RemotingCommand:
        h = PullMessageRequestHeader.from_command(request)
        key = (h.topic, h.consumer_group)
        entry = self.registry.entry(h.topic, h.consumer_group)
        if entry.error is not None and entry.worker is None and entry.ready is not None and entry.ready.done():
            raise entry.error  # a class that did not load: answered before anything is pulled or committed
        suspend = bool(h.sys_flag & FLAG_SUSPEND)
        end = time.monotonic() + (max(0, h.suspend_timeout_millis) / 1000.0 if suspend else 0.0)
        offset, seen, fresh = h.queue_offset, 0, 0  # records filtered by this pull's broker pulls, and kept
        want = max(1, h.max_msg_nums)
        limit = h.max_msg_bytes if h.max_msg_bytes and h.max_msg_bytes > 0 else ANSWER_BYTES
        kept: list[memoryview] = []
        fields: dict[str, str] = {}
        qkey = (h.topic, h.consumer_group, h.queue_id)
        ahead = self.ahead.take(qkey, entry, offset)
        if ahead is not None:
            kept, offset, fields = ahead.records, ahead.end, dict(ahead.fields)
            if len(kept) >= want:  # answered from what was read ahead: no broker pull carries the commit
                if h.sys_flag & FLAG_COMMIT_OFFSET:
                    await self._commit(h)
                return self._found(request, qkey, entry, kept, want, offset, fields, limit)
        for round_no in range(MAX_EMPTY_ROUNDS):
            left_ms = max(0, int((end - time.monotonic()) * 1000))
            flags = FLAG_SUBSCRIPTION
            # Held at the broker only while this pull has read nothing: once records were kept, or filtered
            # out, the answer goes now, so the consumer's offset moves past them (the broker's own tag
            # filter answers a range with no match at once, PULL_RETRY_IMMEDIATELY, and does not hold it).
            if suspend and left_ms > 0 and not kept and not seen:
                flags |= FLAG_SUSPEND
            if round_no == 0 and h.sys_flag & FLAG_COMMIT_OFFSET:
                flags |= FLAG_COMMIT_OFFSET
            selectivity = self._selectivity.get(key) if round_no == 0 else fresh / seen
            fwd = PullMessageRequestHeader(
                consumer_group=h.consumer_group, topic=h.topic, queue_id=h.queue_id, queue_offset=offset,
                max_msg_nums=fetch_size(want - len(kept), selectivity), sys_flag=flags,
                commit_offset=h.commit_offset, suspend_timeout_millis=left_ms if flags & FLAG_SUSPEND else 0,
                subscription="*", sub_version=h.sub_version, expression_type="TAG", max_msg_bytes=h.max_msg_bytes)
            resp = await self.remoting.invoke(self.broker,
                                              RemotingCommand.request(RequestCode.PULL_MESSAGE, fwd.to_ext()),
                                              timeout=left_ms / 1000.0 + BROKER_PULL_SLACK_S)
            if resp.code != ResponseCode.SUCCESS:
                broker_fields = {k: resp.ext_fields[k] for k in _PULL_FIELDS if k in resp.ext_fields}
                if kept:  # the queue's end (or any refusal) after kept records: those first, this offset next
                    return self._found(request, qkey, entry, kept, want, offset, fields, limit)
                if seen and resp.code == ResponseCode.PULL_NOT_FOUND:
                    return request.make_response(resp.code, f"no new message ({seen} filtered out before it)",
                                                 ext_fields=broker_fields)
                return request.make_response(resp.code, resp.remark, ext_fields=broker_fields)
            try:
                decided, out = await self._filter(entry, key, resp.body)
            except FilterClassError:
                if kept:  # what earlier batches kept is answered; the failed batch's pull gets the error
                    return self._found(request, qkey, entry, kept, want, offset, fields, limit)
                raise
            if decided is not entry and kept:  # the class was replaced: no answer mixes two classes' choices
                return self._found(request, qkey, entry, kept, want, offset, fields, limit)
            entry = decided
            fields = {k: resp.ext_fields[k] for k in _PULL_FIELDS if k in resp.ext_fields}
            self._learn(key, out)
            kept.extend(out.kept)
            seen, fresh = seen + out.total, fresh + len(out.kept)
            offset = int(fields.get("nextBeginOffset", offset))
            if len(kept) >= want or sum(map(len, kept)) >= limit:
                break
            if suspend and time.monotonic() >= end:
                break
        if kept:
            return self._found(request, qkey, entry, kept, want, offset, fields, limit)
        return request.make_response(
            ResponseCode.PULL_RETRY_IMMEDIATELY,
            f"{seen} messages pulled, none kept by filter class {entry.class_name}; pull again from "
            "nextBeginOffset", ext_fields={**fields, "nextBeginOffset": str(offset)})

    async def _filter(self, entry: ClassEntry, key: tuple[str, str], body: bytes) -> tuple[ClassEntry, FilterOutcome]:
        try:
            return entry, await self.registry.filter(entry, body)
        except FilterClassError:
            current = self.registry.entries.get(key)
            if current is None or current is entry:
                raise
            # replaced while this batch ran (its worker ended): the new class decides
            return current, await self.registry.filter(current, body)

    def _learn(self, key: tuple[str, str], out: FilterOutcome) -> None:
        if not out.total:
            return
        now = len(out.kept) / out.total
        before = self._selectivity.get(key)
        if before is None and len(self._selectivity) >= MAX_ESTIMATES:
            self._selectivity.clear()
        self._selectivity[key] = now if before is None else before + SELECTIVITY_WEIGHT * (now - before)

    async def _commit(self, h: PullMessageRequestHeader) -> None:
        """The consumer's commitOffset, as its pull would have carried it to the broker."""
        mq = MessageQueue(topic=h.topic, broker_name="", queue_id=h.queue_id)  # the header names no broker
        try:
            await self.api.update_consumer_offset(self.broker, h.consumer_group, mq, h.commit_offset,
                                                  BROKER_PULL_SLACK_S)
        except (SluiceError, OSError) as exc:  # as a pull's commit: never the pull's failure; the next one retries
            log.warning("commit of %s@%s queue %d at %d to broker %s failed: %s", h.topic, h.consumer_group,
                        h.queue_id, h.commit_offset, self.broker, exc)

    def _found(self, request: RemotingCommand, qkey: tuple[str, str, int], entry: ClassEntry,
               kept: list[memoryview], want: int, end: int, fields: dict[str, str],
               limit: int) -> RemotingCommand:
        """FOUND with the first ``want`` kept records within ``limit`` bytes (at least one); the rest read ahead.
        ``end``: where the broker pulls on."""
        fields = {**fields, "nextBeginOffset": str(end)}
        cut, size = 0, 0
        while cut < len(kept) and cut < want and (cut == 0 or size + len(kept[cut]) <= limit):
            size += len(kept[cut])
            cut += 1
        if cut < len(kept):  # the next pull starts at the first kept record left out, answered from read-ahead
            fields["nextBeginOffset"] = str(queue_offset_of(kept[cut]))
            self.ahead.put(qkey, entry, kept[cut:], end, fields)
            kept = kept[:cut]
        return request.make_response(ResponseCode.SUCCESS, ext_fields=fields, body=b"".join(kept))
