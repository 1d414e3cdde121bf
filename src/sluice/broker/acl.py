"""What each broker request asks of the ACL (acl/.../plain/PlainAccessValidator.java ``parse``).

The permission comes from the request table's column (``requests.py``); the resources are the ones the
request names: its topic (``b`` in the compact V2 send header, ``originTopic`` for a message sent back)
with that permission, and its consumer group as the group's retry topic with SUB. A heartbeat names the
groups and subscribed topics in its body. ADMIN rows need an admin account.

Each need but a heartbeat's is built once per (code, topic, group) and named by that tuple (``Need.key``),
so the policy can remember its decision for a signed account instead of walking its permissions again.
"""
from __future__ import annotations

from sluice.acl.policy import PUB, SUB, Need, retry_topic
from sluice.broker.requests import Permission, Route
from sluice.protocol.bodies import HeartbeatData, decode_body
from sluice.protocol.codes import RequestCode as R
from sluice.protocol.command import RemotingCommand

__all__ = ["need_of"]

_PERM = {Permission.PUBLISH: PUB, Permission.SUBSCRIBE: SUB}
_V2 = (int(R.SEND_MESSAGE_V2), int(R.SEND_BATCH_MESSAGE))
_SENDS = (int(R.SEND_MESSAGE), *_V2)
#: A reply's header may come in either naming with either reply code (ReplyProcessor accepts both): its topic
#: is ``b`` or ``topic``, never unnamed (an unnamed topic would ask no permission at all).
_REPLY = (int(R.SEND_REPLY_MESSAGE), int(R.SEND_REPLY_MESSAGE_V2))
_HEART_BEAT = int(R.HEART_BEAT)


#: Needs by (code, topic, group): a client repeats the same few, so each is built once and carries that
#: tuple as its ``key`` (the policy remembers its decisions by it). Bounded: past it the memory starts over.
_NEEDS: dict[tuple[int, str | None, str | None], Need] = {}
_MAX_NEEDS = 65_536


def need_of(route: Route, request: RemotingCommand) -> Need:
    code = int(route.code)
    if route.permission is Permission.ADMIN:
        return Need(code, admin=True, key=(code, None, None))
    perm = _PERM.get(route.permission)
    if perm is None:
        return Need(code, key=(code, None, None))
    ext = request.ext_fields
    if code != _HEART_BEAT:
        if code in _REPLY:
            topic = ext.get("b") or ext.get("topic")
        elif code in _SENDS:
            # The topic the send handler will use (SendMessageRequestHeader.from_command): either naming comes
            # with any send code, so the code alone must not decide where the permission is looked up.
            topic = ext.get("b") if "producerGroup" not in ext and "a" in ext else ext.get("topic")
        else:
            topic = ext.get("originTopic") or ext.get("topic")
        group = ext.get("consumerGroup") or ext.get("group")
        k = (code, topic, group)
        need = _NEEDS.get(k)
        if need is None:
            need = _build(code, perm, topic, group, k)
            if len(_NEEDS) >= _MAX_NEEDS:
                _NEEDS.clear()
            _NEEDS[k] = need
        return need
    resources: dict[str, int] = {}  # a heartbeat: its resources come from its body (no key, not remembered)
    try:
        data = decode_body(HeartbeatData, request.body) if request.body else None
    except Exception:  # a body the handler will refuse precisely; here it names no resource
        data = None
    for consumer in data.consumer_data_set if data is not None else ():
        resources[retry_topic(consumer.group_name)] = SUB
        for sub in consumer.subscription_data_set:
            if not sub.topic.startswith("%RETRY%"):
                resources[sub.topic] = SUB
    return Need(code, resources=resources)


def _build(code: int, perm: int, topic: str | None, group: str | None, key: tuple) -> Need:
    resources: dict[str, int] = {}
    if topic:
        resources[topic] = perm
    if group and code not in _V2 and code != int(R.SEND_MESSAGE):
        resources[retry_topic(group)] = SUB
    return Need(code, resources=resources, key=key)
