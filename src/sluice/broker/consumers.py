"""Who is connected: consumer groups (members, subscriptions) and producer groups (RocketMQ's ConsumerManager).

A client is known by its client id and the connection its heartbeats come on.
Members leave by UNREGISTER_CLIENT, when their connection closes, or after
``channel_expiry_s`` without a heartbeat (RocketMQ: 120 s). Every membership
change of a consumer group is reported to ``on_change(group, connections)`` so
the broker can send NOTIFY_CONSUMER_IDS_CHANGED to the remaining members.

Runs on the event loop only (no locks): heartbeats, connection callbacks and
the expiry scan are all loop callbacks.
"""
from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from sluice.broker.filtering import CompiledSubscription
from sluice.transport.connection import RemotingConnection

__all__ = ["ClientChannel", "ConsumerGroupInfo", "ConsumerManager"]

log = logging.getLogger(__name__)

ChangeListener = Callable[[str, list[RemotingConnection]], None]


@dataclass(slots=True)
class ClientChannel:
    client_id: str
    conn: RemotingConnection
    language: str
    version: int
    last_update: float

    def to_wire(self) -> dict:
        return {"clientId": self.client_id, "clientAddr": self.conn.peer, "language": self.language,
                "version": self.version}


@dataclass(slots=True)
class ConsumerGroupInfo:
    group: str
    consume_type: str = "CONSUME_PASSIVELY"
    message_model: str = "CLUSTERING"
    consume_from_where: str = "CONSUME_FROM_LAST_OFFSET"
    channels: dict[str, ClientChannel] = field(default_factory=dict)  # client id -> channel
    subscriptions: dict[str, CompiledSubscription] = field(default_factory=dict)  # topic -> subscription
    #: (topic, client id) -> (a class-filter error the member's heartbeat reported, when, epoch ms)
    class_errors: dict[tuple[str, str], tuple[str, int]] = field(default_factory=dict)

    def client_ids(self) -> list[str]:
        return sorted(self.channels)

    def class_filter_errors(self) -> list[dict[str, object]]:
        """The live members' class-filter errors (GET_CONSUME_STATS ``classFilterErrors``)."""
        out = []
        for (topic, client_id), (error, when) in sorted(self.class_errors.items()):
            sub = self.subscriptions.get(topic)
            if client_id in self.channels:
                out.append({"topic": topic, "clientId": client_id, "className": sub.expression if sub else None,
                            "error": error, "timestamp": when})
        return out


@dataclass(slots=True)
class _ProducerGroup:
    channels: dict[str, ClientChannel] = field(default_factory=dict)


class ConsumerManager:
    def __init__(self, *, channel_expiry_s: float = 120.0, clock: Callable[[], float] = time.monotonic,
                 on_change: ChangeListener | None = None) -> None:
        self.channel_expiry_s = channel_expiry_s
        self._clock = clock
        self.on_change = on_change
        self.groups: dict[str, ConsumerGroupInfo] = {}
        self.producers: dict[str, _ProducerGroup] = {}

    # ---- consumers ---------------------------------------------------------------------------------
    def register_consumer(self, group: str, client_id: str, conn: RemotingConnection, *, language: str,
                          version: int, consume_type: str, message_model: str, consume_from_where: str,
                          subscriptions: list[CompiledSubscription], class_errors: dict[str, str] | None = None,
                          ) -> bool:
        """Record a heartbeat; True when the group's members or subscriptions changed. ``class_errors``:
        topic -> the class-filter error the member reports (the member's earlier ones are cleared)."""
        info = self.groups.get(group)
        if info is None:
            info = self.groups[group] = ConsumerGroupInfo(group)
        info.consume_type, info.message_model, info.consume_from_where = \
            consume_type, message_model, consume_from_where
        now = self._clock()
        ch = info.channels.get(client_id)
        members_changed = ch is None or ch.conn is not conn
        if members_changed:
            info.channels[client_id] = ClientChannel(client_id, conn, language, version, now)
        else:
            ch.last_update = now
        for key in [k for k in info.class_errors if k[1] == client_id]:
            del info.class_errors[key]
        for topic, error in (class_errors or {}).items():
            if error:
                info.class_errors[(topic, client_id)] = (error[:2000], int(time.time() * 1000))
        subs_changed = False
        new = {s.topic: s for s in subscriptions}
        for topic, sub in new.items():
            old = info.subscriptions.get(topic)
            if old is None or (old.expression, old.expression_type) != (sub.expression, sub.expression_type):
                subs_changed = True
                info.subscriptions[topic] = sub
            elif sub.sub_version > old.sub_version:
                info.subscriptions[topic] = sub
        # RocketMQ drops topics the group no longer subscribes to (ConsumerGroupInfo.updateSubscription).
        for topic in [t for t in info.subscriptions if t not in new]:
            del info.subscriptions[topic]
            subs_changed = True
        if members_changed:
            self._changed(group)
        return members_changed or subs_changed

    def unregister_consumer(self, group: str, client_id: str) -> bool:
        info = self.groups.get(group)
        if info is None or info.channels.pop(client_id, None) is None:
            return False
        if not info.channels:
            del self.groups[group]
        self._changed(group)
        return True

    def get(self, group: str) -> ConsumerGroupInfo | None:
        return self.groups.get(group)

    def find_subscription(self, group: str, topic: str) -> CompiledSubscription | None:
        info = self.groups.get(group)
        return None if info is None else info.subscriptions.get(topic)

    # ---- producers ---------------------------------------------------------------------------------
    def register_producer(self, group: str, client_id: str, conn: RemotingConnection, *, language: str,
                          version: int) -> None:
        pg = self.producers.setdefault(group, _ProducerGroup())
        ch = pg.channels.get(client_id)
        if ch is None or ch.conn is not conn:
            pg.channels[client_id] = ClientChannel(client_id, conn, language, version, self._clock())
        else:
            ch.last_update = self._clock()

    def unregister_producer(self, group: str, client_id: str) -> None:
        pg = self.producers.get(group)
        if pg is not None:
            pg.channels.pop(client_id, None)
            if not pg.channels:
                del self.producers[group]

    # ---- connections -------------------------------------------------------------------------------
    def connection_closed(self, conn: RemotingConnection) -> list[str]:
        """Drop every client that spoke on ``conn``; returns the client ids dropped."""
        return self._drop(lambda ch: ch.conn is conn, "connection closed")

    def scan_expired(self) -> list[str]:
        """Drop clients silent for longer than the expiry (their connections are closed by the caller)."""
        limit = self._clock() - self.channel_expiry_s
        return self._drop(lambda ch: ch.last_update < limit, "no heartbeat for %.0f s" % self.channel_expiry_s)

    def expired_connections(self) -> list[RemotingConnection]:
        limit = self._clock() - self.channel_expiry_s
        out = {id(ch.conn): ch.conn for info in self.groups.values() for ch in info.channels.values()
               if ch.last_update < limit}
        out.update({id(ch.conn): ch.conn for pg in self.producers.values() for ch in pg.channels.values()
                    if ch.last_update < limit})
        return list(out.values())

    def _drop(self, pred: Callable[[ClientChannel], bool], why: str) -> list[str]:
        dropped: list[str] = []
        for group in list(self.groups):
            info = self.groups[group]
            gone = [cid for cid, ch in info.channels.items() if pred(ch)]
            for cid in gone:
                del info.channels[cid]
                log.info("consumer %s of group %s removed: %s", cid, group, why)
            dropped += gone
            if gone:
                if not info.channels:
                    del self.groups[group]
                self._changed(group)
        for group in list(self.producers):
            pg = self.producers[group]
            for cid in [cid for cid, ch in pg.channels.items() if pred(ch)]:
                del pg.channels[cid]
                dropped.append(cid)
            if not pg.channels:
                del self.producers[group]
        return dropped

    def _changed(self, group: str) -> None:
        if self.on_change is None:
            return
        info = self.groups.get(group)
        conns = [] if info is None else [ch.conn for ch in info.channels.values()]
        try:
            self.on_change(group, conns)
        except Exception:
            log.exception("consumer-change listener failed for group %s", group)
