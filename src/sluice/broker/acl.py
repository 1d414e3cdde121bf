"""What each broker request asks of the ACL (acl/.../plain/PlainAccessValidator.java ``parse``).

The permission comes from the request table's column (``requests.py``); the resources are the ones the
request names: its topic (``b`` in the compact V2 send header, ``originTopic`` for a message sent back)
with that permission, and its consumer group as the group's retry topic with SUB. A heartbeat names the
groups and subscribed topics in its body. ADMIN rows need an admin account.

``need_function(route)`` is that reading specialised to one route, made once when the broker registers the
route (``acl_checked``), so a request pays for its own route's lookups only. Each need but a heartbeat's is
built once per (code, topic, group) and named by that tuple (``Need.key``), so the policy can remember its
decision for a signed account instead of walking its permissions again.
"""
from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from sluice.acl.guard import AclGuard
from sluice.acl.policy import PUB, SUB, Need, retry_topic
from sluice.broker.requests import Permission, Route
from sluice.protocol.bodies import HeartbeatData, decode_body
from sluice.protocol.codes import RequestCode as R
from sluice.protocol.command import RemotingCommand
from sluice.transport.connection import RemotingConnection, RequestHandler

__all__ = ["need_of", "need_function", "acl_check", "acl_checked"]

NeedFunction = Callable[[RemotingCommand], Need]

_PERM = {Permission.PUBLISH: PUB, Permission.SUBSCRIBE: SUB}
_SENDS = (int(R.SEND_MESSAGE), int(R.SEND_MESSAGE_V2), int(R.SEND_BATCH_MESSAGE))
#: A reply's header may come in either naming with either reply code (ReplyProcessor accepts both): its topic
#: is ``b`` or ``topic``, never unnamed (an unnamed topic would ask no permission at all).
_REPLY = (int(R.SEND_REPLY_MESSAGE), int(R.SEND_REPLY_MESSAGE_V2))
_HEART_BEAT = int(R.HEART_BEAT)

#: Needs per code, by topic (sends) or (topic, group) (the rest): a client repeats the same few, so each is
#: built once. Bounded: past _MAX_NEEDS for one code, that code's memory starts over.
_NEEDS: dict[int, dict[Any, Need]] = {}
_MAX_NEEDS = 65_536
_FUNCTIONS: dict[int, NeedFunction] = {}


def need_of(route: Route, request: RemotingCommand) -> Need:
    """What ``request``, served by ``route``, needs of the ACL."""
    fn = _FUNCTIONS.get(int(route.code))
    if fn is None:
        fn = _FUNCTIONS[int(route.code)] = need_function(route)
    return fn(request)


def acl_checked(guard: AclGuard, route: Route, handler: RequestHandler) -> RequestHandler:
    """``handler`` behind the ACL (PlainAccessValidator): a refusal raises NoPermissionError before it runs,
    so nothing changes. Keeps a plain handler plain and an async one async. The check is written into the
    one wrapper (no closure of its own to call per request)."""
    need = need_function(route)
    check = guard.check
    if asyncio.iscoroutinefunction(handler):
        async def checked(conn: RemotingConnection, request: RemotingCommand) -> Any:
            check(conn.peer, request.ext_fields, request.body, need(request))
            return await handler(conn, request)
        return checked

    def checked_now(conn: RemotingConnection, request: RemotingCommand) -> Any:
        check(conn.peer, request.ext_fields, request.body, need(request))
        return handler(conn, request)
    return checked_now


def _nothing(conn: RemotingConnection, request: RemotingCommand) -> None:
    return None


def acl_check(guard: AclGuard, route: Route) -> Callable[[RemotingConnection, RemotingCommand], None]:
    """The broker's check before ``route``'s handler alone: raises NoPermissionError unless ``guard`` allows it
    (``acl_checked`` with a handler that does nothing)."""
    return acl_checked(guard, route, _nothing)


def need_function(route: Route) -> NeedFunction:
    """``need_of`` for requests of ``route`` alone."""
    code = int(route.code)
    if route.permission is Permission.ADMIN:
        admin = Need(code, admin=True, key=(code, None, None))
        return lambda request: admin
    perm = _PERM.get(route.permission)
    if perm is None:
        free = Need(code, key=(code, None, None))
        return lambda request: free
    if code == _HEART_BEAT:
        return _heartbeat_need
    needs = _NEEDS.setdefault(code, {})
    if code in _SENDS:
        # A send needs PUB on its topic alone, whatever group it names, so its needs are kept by topic.
        def send_need(request: RemotingCommand) -> Need:
            ext = request.ext_fields
            # The topic the send handler will use (SendMessageRequestHeader.from_command): either naming
            # comes with any send code, so the code alone must not decide where the permission is looked up.
            topic = ext.get("b") if "producerGroup" not in ext and "a" in ext else ext.get("topic")
            need = needs.get(topic)
            if need is None:
                need = _remember(needs, topic, Need(code, resources={topic: perm} if topic else {},
                                                    key=(code, topic, None)))
            return need
        return send_need
    reply = code in _REPLY

    def need_of_request(request: RemotingCommand) -> Need:
        ext = request.ext_fields
        topic = (ext.get("b") or ext.get("topic")) if reply else (ext.get("originTopic") or ext.get("topic"))
        group = ext.get("consumerGroup") or ext.get("group")
        k = (topic, group)
        need = needs.get(k)
        if need is None:
            resources: dict[str, int] = {}
            if topic:
                resources[topic] = perm
            if group:
                resources[retry_topic(group)] = SUB
            need = _remember(needs, k, Need(code, resources=resources, key=(code, topic, group)))
        return need
    return need_of_request


def _remember(needs: dict[Any, Need], k: Any, need: Need) -> Need:
    if len(needs) >= _MAX_NEEDS:
        needs.clear()
    needs[k] = need
    return need


def _heartbeat_need(request: RemotingCommand) -> Need:
    """A heartbeat's resources come from its body (no key: not remembered)."""
    resources: dict[str, int] = {}
    try:
        data = decode_body(HeartbeatData, request.body) if request.body else None
    except Exception:  # a body the handler will refuse precisely; here it names no resource
        data = None
    for consumer in data.consumer_data_set if data is not None else ():
        resources[retry_topic(consumer.group_name)] = SUB
        for sub in consumer.subscription_data_set:
            if not sub.topic.startswith("%RETRY%"):
                resources[sub.topic] = SUB
    return Need(_HEART_BEAT, resources=resources)
