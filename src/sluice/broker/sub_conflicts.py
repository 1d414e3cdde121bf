"""Members of one consumer group subscribing differently to one topic: refused loudly, never silently.

RocketMQ keeps one subscription per group; members with another filter skip
(and commit past) messages the others wanted. Sluice keeps, per group and
topic, the subscription the group has and which live members hold it. A
member that subscribes differently:

* with a newer subscription version wins for the group (a rolling change of
  the filter); the members still on the old one are refused from then on;
* otherwise is refused, at heartbeat and on every pull that carries its
  subscription, with SUBSCRIPTION_NOT_LATEST and a remark naming both
  expressions and the clients.

Each refusal is logged as a warning and recorded (GET_CONSUME_STATS shows
``subscriptionConflicts``). When no member holding the group's subscription is
left, a different one is simply accepted.
"""
from __future__ import annotations

import logging
import time
from collections.abc import Iterable
from dataclasses import dataclass, field

from sluice.errors import SluiceError
from sluice.protocol.codes import ResponseCode

__all__ = ["SubscriptionConflictError", "SubscriptionGuard", "Conflict"]

log = logging.getLogger(__name__)

MAX_CONFLICTS_PER_GROUP = 64


class SubscriptionConflictError(SluiceError):
    code = ResponseCode.SUBSCRIPTION_NOT_LATEST


@dataclass(slots=True)
class _Held:
    expression_type: str
    expression: str
    version: int
    clients: set[str] = field(default_factory=set)


@dataclass(slots=True)
class Conflict:
    group: str
    topic: str
    kept_type: str
    kept_expression: str
    kept_version: int
    kept_clients: list[str]
    refused_type: str
    refused_expression: str
    refused_version: int
    refused_client: str | None
    where: str
    count: int = 1
    last_time: int = 0

    def message(self) -> str:
        who = f"client {self.refused_client}" if self.refused_client else "this pull"
        return (f"subscription conflict in consumer group {self.group!r} on topic {self.topic!r}: the group "
                f"subscribes {self.kept_type} {self.kept_expression!r} (version {self.kept_version}, clients "
                f"{', '.join(self.kept_clients) or '-'}), but {who} subscribes {self.refused_type} "
                f"{self.refused_expression!r} (version {self.refused_version}); all members of a group must "
                "subscribe alike (a newer subscription version replaces the group's)")

    def to_wire(self) -> dict[str, object]:
        return {"topic": self.topic, "keptExpressionType": self.kept_type, "keptExpression": self.kept_expression,
                "keptVersion": self.kept_version, "keptClients": self.kept_clients,
                "refusedExpressionType": self.refused_type, "refusedExpression": self.refused_expression,
                "refusedVersion": self.refused_version, "refusedClient": self.refused_client, "where": self.where,
                "count": self.count, "lastTimestamp": self.last_time, "message": self.message()}


class SubscriptionGuard:
    def __init__(self) -> None:
        self._held: dict[tuple[str, str], _Held] = {}
        self.conflicts: dict[str, dict[tuple[str, str, str, str | None], Conflict]] = {}

    def check_heartbeat(self, group: str, client_id: str, subs: Iterable[tuple[str, str, str, int]],
                        live_clients: Iterable[str]) -> None:
        """Check (topic, type, expression, version) of one member's heartbeat; raise before anything is
        taken over, take it over when it is consistent (or newer)."""
        subs = list(subs)
        live = set(live_clients) - {client_id}
        for topic, etype, expr, version in subs:
            held = self._held.get((group, topic))
            if held is None or (held.expression_type, held.expression) == (etype, expr):
                continue
            holders = held.clients & live
            if holders and version <= held.version:
                raise SubscriptionConflictError(self._record(group, topic, held, holders, etype, expr, version,
                                                             client_id, "heartbeat").message())
        for topic, etype, expr, version in subs:
            held = self._held.get((group, topic))
            if held is None or (held.expression_type, held.expression) != (etype, expr):
                if held is not None and held.clients & live:
                    log.warning("consumer group %s on %s: client %s's newer subscription %s %r (version %d) "
                                "replaces %s %r (version %d) of %s", group, topic, client_id, etype, expr, version,
                                held.expression_type, held.expression, held.version,
                                ", ".join(sorted(held.clients & live)))
                self._held[(group, topic)] = _Held(etype, expr, version, {client_id})
            else:
                held.clients = (held.clients & (live | {client_id})) | {client_id}
                held.version = max(held.version, version)

    def check_pull(self, group: str, topic: str, etype: str, expr: str, version: int,
                   live_clients: Iterable[str]) -> None:
        """A pull that carries its subscription: refuse one that differs from the group's and is not newer."""
        held = self._held.get((group, topic))
        if held is None or (held.expression_type, held.expression) == (etype, expr):
            return
        holders = held.clients & set(live_clients)
        if holders and version <= held.version:
            raise SubscriptionConflictError(self._record(group, topic, held, holders, etype, expr, version, None,
                                                         "pull").message())

    def group_subscription(self, group: str, topic: str) -> tuple[str, str, int] | None:
        held = self._held.get((group, topic))
        return None if held is None else (held.expression_type, held.expression, held.version)

    def _record(self, group: str, topic: str, held: _Held, holders: set[str], etype: str, expr: str, version: int,
                client: str | None, where: str) -> Conflict:
        table = self.conflicts.setdefault(group, {})
        key = (topic, etype, expr, client)
        now = int(time.time() * 1000)
        c = table.get(key)
        if c is None or (c.kept_type, c.kept_expression) != (held.expression_type, held.expression):
            if len(table) >= MAX_CONFLICTS_PER_GROUP:
                table.pop(min(table, key=lambda k: table[k].last_time))
            c = table[key] = Conflict(group, topic, held.expression_type, held.expression, held.version,
                                      sorted(holders), etype, expr, version, client, where, 0)
        c.count += 1
        c.last_time = now
        c.kept_clients = sorted(holders)
        c.where = where
        if c.count == 1 or c.count % 100 == 0:
            log.warning("%s (refused at %s, %d times)", c.message(), where, c.count)
        return c

    def conflicts_of(self, group: str) -> list[Conflict]:
        return sorted(self.conflicts.get(group, {}).values(), key=lambda c: (c.topic, -c.last_time))
