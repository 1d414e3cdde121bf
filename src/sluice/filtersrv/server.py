"""The filter server: serves class-filter pulls for the groups of one broker
(RocketMQ's FiltersrvController and PullMessageForwardProcessor,
filtersrv/src/main/java/org/apache/rocketmq/filtersrv/).

* It registers with its broker (REGISTER_FILTER_SERVER, 301: header
  filterServerAddr) every ``register_interval`` seconds; the broker lists it in
  its namesrv registrations, so routes carry it in ``filterServerTable``.
* Consumers register their group's class for a topic (REGISTER_MESSAGE_FILTER_CLASS,
  302; sluice/filtersrv/registry.py), then pull (PULL_MESSAGE, 11) with the
  class-filter flag 0x8.
* A pull is forwarded to the broker as a plain ``*`` subscription pull of the
  group (the consumer's commitOffset forwarded with the commit flag, so the
  group's offsets are the broker's; long polling as the consumer asked). The
  class runs on the batch in its worker; the answer is the broker's, with the
  body cut to the records the class kept.
* The broker is asked for ``OVERFETCH`` times the messages the consumer asked
  for (at most 1024, the broker's own cap); when the class keeps more than the
  consumer asked for, the answer is cut there and its nextBeginOffset is the
  queue offset of the first kept record left out (the filtered-out records
  before it are skipped, not read again).
* A batch the class keeps nothing of is not answered FOUND-with-nothing (RocketMQ
  clients cannot take that): the server pulls on from the next offset, in batches of
  ``MAX_FETCH`` (a class that kept nothing is a sparse one), up to
  ``MAX_EMPTY_ROUNDS`` broker pulls within the pull's time, then answers
  PULL_RETRY_IMMEDIATELY (the broker's own answer when nothing of what it read
  matched, and RocketMQ's filter server's after a single pull: pullMessageForward in
  filtersrv/src/main/java/org/apache/rocketmq/filtersrv/processor/DefaultRequestProcessor.java)
  with nextBeginOffset past the skipped records, or the broker's
  PULL_NOT_FOUND at the queue's end, its nextBeginOffset likewise past them.
* With ``acl`` (a plain_acl.yml, the broker's) every request is checked as the
  broker checks a pull: SUB on the topic and on the group's retry topic; a 302
  that uploads source needs an admin account besides. The filter server signs
  its own requests to the broker with ``credentials`` (301 needs admin, pulls SUB).
* The class failing on a batch answers SYSTEM_ERROR (FilterClassFailedError) with
  a remark naming the class and the cause, and no nextBeginOffset: the consumer
  pulls the same offset again, so nothing is skipped unfiltered.
"""
from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field
from typing import Any

from sluice.acl.guard import AclGuard
from sluice.acl.policy import SUB, Need, retry_topic
from sluice.acl.signature import Credentials
from sluice.acl.signing import remoting_client
from sluice.errors import FilterClassError, InvalidParameterError
from sluice.format import POS_QUEUEOFFSET
from sluice.filtersrv.registry import FilterClassRegistry
from sluice.filtersrv.repository import ClassRepository
from sluice.filtersrv.sandbox import WorkerLimits
from sluice.protocol.codes import RequestCode, ResponseCode
from sluice.protocol.command import RemotingCommand
from sluice.protocol.headers import PullMessageRequestHeader
from sluice.transport.client import RemotingClient
from sluice.transport.connection import RemotingConnection
from sluice.transport.server import RemotingServer

__all__ = ["FiltersrvConfig", "FilterServer", "FLAG_CLASS_FILTER", "MAX_EMPTY_ROUNDS"]

log = logging.getLogger(__name__)

# PullSysFlag (common/src/main/java/org/apache/rocketmq/common/sysflag/PullSysFlag.java)
FLAG_COMMIT_OFFSET, FLAG_SUSPEND, FLAG_SUBSCRIPTION, FLAG_CLASS_FILTER = 0x1, 0x2, 0x4, 0x8
#: Broker pulls one consumer pull may make while every batch is filtered out.
MAX_EMPTY_ROUNDS = 8
#: Messages asked of the broker per message the consumer asked for: at 10 % selectivity a 32-message pull
#: is answered from one broker pull and one worker call instead of ten.
OVERFETCH = 8
#: The most messages asked of the broker at once (a Sluice broker's max_transfer_count default).
MAX_FETCH = 1024
#: Time a broker pull may take beyond the suspend time it asks for.
BROKER_PULL_SLACK_S = 5.0
_PULL_FIELDS = ("suggestWhichBrokerId", "nextBeginOffset", "minOffset", "maxOffset")


@dataclass(frozen=True, kw_only=True)
class FiltersrvConfig:
    #: The broker this filter server serves (HOST:PORT).
    broker: str
    #: Where consumers connect (HOST:PORT; port 0 picks a free one). Registered with the broker as is.
    listen: str = "127.0.0.1:0"
    #: The directory of filter-class modules (uploads off: the only source of classes).
    repository: str | None = None
    #: A base URL of filter-class modules, tried where the directory has no such module.
    repository_url: str | None = None
    #: Accept class source sent by consumers (302 body); off by default: uploaded code is code from anyone
    #: who can reach the port.
    uploads: bool = False
    limits: WorkerLimits = field(default_factory=WorkerLimits)
    #: RocketMQ's FiltersrvController registers every 10 s; the broker drops one silent for 30 s.
    register_interval: float = 10.0
    #: How often repository files are re-read for changed classes (RocketMQ: every minute).
    check_interval: float = 60.0
    #: A plain_acl.yml checked on every request (None: no ACL); uploading source needs an admin account.
    acl: str | None = None
    #: The account the filter server signs its requests to the broker with (a broker with ACL on).
    credentials: Credentials | None = None


def queue_offset_of(record: memoryview) -> int:
    """The queue offset a stored record carries (format.POS_QUEUEOFFSET)."""
    return int.from_bytes(record[POS_QUEUEOFFSET:POS_QUEUEOFFSET + 8], "big", signed=True)


class FilterServer:
    def __init__(self, config: FiltersrvConfig, *, remoting: RemotingClient | None = None) -> None:
        self.config = config
        host, _, port = config.listen.rpartition(":")
        if not host or not port.isdigit():
            raise InvalidParameterError(f"listen address {config.listen!r} is not HOST:PORT")
        self.server = RemotingServer(host, int(port))
        self.remoting = remoting or remoting_client(config.credentials)
        self.acl = AclGuard(config.acl) if config.acl else None
        self.registry = FilterClassRegistry(ClassRepository(config.repository, config.repository_url), config.limits,
                                            uploads=config.uploads, check_interval=config.check_interval)
        self.broker_name: str | None = None
        self.broker_id: int | None = None
        self.server.register(RequestCode.REGISTER_MESSAGE_FILTER_CLASS, self._checked(self.register_class))
        self.server.register(RequestCode.PULL_MESSAGE, self._checked(self.pull))
        self.server.on_connection_close(self.registry.forget_owner)
        self._tasks: list[asyncio.Task[None]] = []
        self.registered = asyncio.Event()

    @property
    def address(self) -> str:
        return self.server.address

    async def start(self) -> None:
        await self.server.start()
        self.registry.start()
        loop = asyncio.get_running_loop()
        self._tasks.append(loop.create_task(self._register_loop(), name="filtersrv-register"))
        log.info("filter server %s serving broker %s (repository %s, uploads %s)", self.address,
                 self.config.broker, self.config.repository or "-", "on" if self.config.uploads else "off")

    async def stop(self) -> None:
        for t in self._tasks:
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self.server.close()
        await self.registry.close()
        await self.remoting.close()

    def _checked(self, handler: Any) -> Any:
        """``handler`` behind the ACL (when on): SUB on the topic and the group's retry topic, admin to upload."""
        acl = self.acl
        if acl is None:
            return handler

        async def checked(conn: RemotingConnection, request: RemotingCommand) -> RemotingCommand:
            ext = request.ext_fields
            resources = {}
            if ext.get("topic"):
                resources[ext["topic"]] = SUB
            if ext.get("consumerGroup"):
                resources[retry_topic(ext["consumerGroup"])] = SUB
            upload = request.code == RequestCode.REGISTER_MESSAGE_FILTER_CLASS and bool(request.body)
            acl.check(conn.peer, ext, request.body, Need(request.code, admin=upload, resources=resources))
            return await handler(conn, request)
        return checked

    # ------------------------------------------------------------------------------------------ 301

    async def register_with_broker(self) -> None:
        """REGISTER_FILTER_SERVER (301): raises the broker's error."""
        req = RemotingCommand.request(RequestCode.REGISTER_FILTER_SERVER, {"filterServerAddr": self.address})
        resp = (await self.remoting.invoke(self.config.broker, req, timeout=3.0)).raise_for_code()
        name, bid = resp.ext_fields.get("brokerName"), resp.ext_fields.get("brokerId", "0")
        if self.broker_name != name:
            log.info("filter server %s registered with broker %s (%s, id %s)", self.address, name,
                     self.config.broker, bid)
        self.broker_name, self.broker_id = name, int(bid)
        self.registered.set()

    async def _register_loop(self) -> None:
        """Register every interval, and at once when the connection to the broker closes: the broker drops
        a filter server whose connection closed, so waiting for the next tick would leave it out of routes."""
        failing = False
        again = asyncio.Event()
        watched: RemotingConnection | None = None
        while True:
            again.clear()
            try:
                await self.register_with_broker()
                failing = False
                conn = await self.remoting.connection(self.config.broker)
                if conn is not watched:
                    watched = conn
                    conn.on_close(lambda _c: again.set())
            except Exception as exc:  # the broker may be restarting: keep trying, log once per outage
                if not failing:
                    log.warning("filter server %s: registering with broker %s failed: %s", self.address,
                                self.config.broker, exc)
                failing = True
            try:
                # while failing, try every second: the broker is likely restarting and routes miss us meanwhile
                async with asyncio.timeout(min(1.0, self.config.register_interval) if failing
                                           else self.config.register_interval):
                    await again.wait()
                await asyncio.sleep(0.2)  # a broker going down: do not spin on refused connections
            except TimeoutError:
                pass

    # ------------------------------------------------------------------------------------------ 302

    async def register_class(self, conn: RemotingConnection, request: RemotingCommand) -> RemotingCommand:
        ext = request.ext_fields
        group, topic, class_name = ext.get("consumerGroup"), ext.get("topic"), ext.get("className")
        if not group or not topic or not class_name:
            raise InvalidParameterError("REGISTER_MESSAGE_FILTER_CLASS needs consumerGroup, topic and className")
        try:
            crc = int(ext.get("classCRC") or 0) & 0xFFFFFFFF  # Java sends a signed int
        except ValueError:
            raise InvalidParameterError(f"classCRC {ext.get('classCRC')!r} is not an integer") from None
        try:
            await self.registry.register(group, topic, class_name, crc, request.body or b"", conn,
                                         lambda: not conn.is_closed)
        except FilterClassError as exc:
            log.warning("filter class %s for %s@%s from %s refused: %s", class_name, topic, group, conn.peer, exc)
            raise
        return request.make_response(ResponseCode.SUCCESS)

    # ------------------------------------------------------------------------------------------ pull

    async def pull(self, conn: RemotingConnection, request: RemotingCommand) -> RemotingCommand:
        h = PullMessageRequestHeader.from_command(request)
        entry = self.registry.entry(h.topic, h.consumer_group)
        if entry.error is not None and entry.worker is None and entry.ready is not None and entry.ready.done():
            raise entry.error  # a class that did not load: answered before anything is pulled or committed
        suspend = bool(h.sys_flag & FLAG_SUSPEND)
        end = time.monotonic() + (max(0, h.suspend_timeout_millis) / 1000.0 if suspend else 0.0)
        offset, skipped = h.queue_offset, 0
        want = max(1, h.max_msg_nums)
        fetch = min(MAX_FETCH, want * OVERFETCH)
        for round_no in range(MAX_EMPTY_ROUNDS):
            left_ms = max(0, int((end - time.monotonic()) * 1000))
            flags = FLAG_SUBSCRIPTION
            if suspend and left_ms > 0:
                flags |= FLAG_SUSPEND
            if round_no == 0 and h.sys_flag & FLAG_COMMIT_OFFSET:
                flags |= FLAG_COMMIT_OFFSET
            fwd = PullMessageRequestHeader(
                consumer_group=h.consumer_group, topic=h.topic, queue_id=h.queue_id, queue_offset=offset,
                max_msg_nums=fetch, sys_flag=flags, commit_offset=h.commit_offset,
                suspend_timeout_millis=left_ms, subscription="*", sub_version=h.sub_version,
                expression_type="TAG", max_msg_bytes=h.max_msg_bytes)
            resp = await self.remoting.invoke(self.config.broker,
                                              RemotingCommand.request(RequestCode.PULL_MESSAGE, fwd.to_ext()),
                                              timeout=left_ms / 1000.0 + BROKER_PULL_SLACK_S)
            fields = {k: resp.ext_fields[k] for k in _PULL_FIELDS if k in resp.ext_fields}
            if resp.code != ResponseCode.SUCCESS:
                if skipped and resp.code == ResponseCode.PULL_NOT_FOUND:
                    return request.make_response(resp.code, f"no new message ({skipped} filtered out before it)",
                                                 ext_fields=fields)
                return request.make_response(resp.code, resp.remark, ext_fields=fields)
            try:
                out = await self.registry.filter(entry, resp.body)
            except FilterClassError:
                current = self.registry.entries.get((h.topic, h.consumer_group))
                if current is None or current is entry:
                    raise
                entry = current  # replaced while this batch ran (its worker ended): the new class decides
                out = await self.registry.filter(entry, resp.body)
            if out.kept:
                if len(out.kept) > want:  # the rest is read again from the first kept record left out
                    fields["nextBeginOffset"] = str(queue_offset_of(out.kept[want]))
                return request.make_response(ResponseCode.SUCCESS, ext_fields=fields, body=b"".join(out.kept[:want]))
            skipped += out.total
            fetch = MAX_FETCH  # nothing kept: a sparse class, so read on in the largest batches
            offset = int(fields.get("nextBeginOffset", offset))
            if suspend and time.monotonic() >= end:
                break
        return request.make_response(
            ResponseCode.PULL_RETRY_IMMEDIATELY,
            f"{skipped} messages pulled, none kept by filter class {entry.class_name}; pull again from "
            "nextBeginOffset", ext_fields={**fields, "nextBeginOffset": str(offset)})
