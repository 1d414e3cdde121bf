"""Subscription groups of one broker, persisted in {store}/config/subscriptionGroup.json (RocketMQ's
SubscriptionGroupManager, broker/src/main/java/org/apache/rocketmq/broker/subscription/).

The file has RocketMQ's shape: ``subscriptionGroupTable`` (group -> SubscriptionGroupConfig with its JSON
names) and ``dataVersion``. A group is created by UPDATE_AND_CREATE_SUBSCRIPTIONGROUP (200), or, with
``auto_create_subscription_group`` on (RocketMQ's autoCreateSubscriptionGroup, default true), by the first
heartbeat or send-back naming it (findSubscriptionGroupConfig). A pull of an unknown group is served with the
defaults but creates nothing: Sluice's group-less readers (the Spark source) pull under throw-away group names,
and each would otherwise leave an entry behind. With auto-creation off an unknown group's pulls get
SUBSCRIPTION_GROUP_NOT_EXIST, as in RocketMQ.

Honoured (broker/.../processor/PullMessageProcessor.java, SendMessageProcessor.java):
``consumeEnable`` false answers the group's pulls NO_PERMISSION; ``consumeBroadcastEnable`` false refuses a
broadcasting group's pulls; ``retryMaxTimes`` is the send-back limit before the DLQ when the client names
none; ``retryQueueNums`` is the new retry topic's queue count (0: failed messages go to the DLQ at once, where
RocketMQ drops them); ``notifyConsumerIdsChangedEnable`` false sends members no NOTIFY_CONSUMER_IDS_CHANGED.
``brokerId`` and ``whichBrokerWhenConsumeSlowly`` are kept and reported: they steer pulls to slaves only with
slaveReadEnable, which Sluice (masters only) does not have, so pulls always suggest the master, as RocketMQ
does with its default slaveReadEnable=false. ``consumeFromMinEnable`` is kept; RocketMQ 4.x reads it nowhere.
"""
from __future__ import annotations

import dataclasses
import re
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import logging
from collections.abc import Callable

import orjson

from sluice.errors import InvalidParameterError, SubscriptionGroupNotExistError
from sluice.persist import JsonSaver, read_json
from sluice.protocol.bodies import loads_lenient
from sluice.protocol.command import RemotingCommand
from sluice.protocol.headers import DeleteSubscriptionGroupRequestHeader
from sluice.transport.connection import RemotingConnection

__all__ = ["SubscriptionGroupConfig", "SubscriptionGroupManager", "SubscriptionGroupProcessor", "SYSTEM_GROUPS",
           "FIELDS", "check_group", "not_exist"]

log = logging.getLogger(__name__)

#: The groups RocketMQ's SubscriptionGroupManager.init creates on every broker (MixAll's group names).
SYSTEM_GROUPS = ("TOOLS_CONSUMER", "FILTERSRV_CONSUMER", "SELF_TEST_C_GROUP", "CID_ONS-HTTP-PROXY",
                 "CID_ONSAPI_PULL", "CID_ONSAPI_PERMISSION", "CID_ONSAPI_OWNER", "CID_SYS_RMQ_TRANS")
#: MixAll.CID_RMQ_SYS_PREFIX: such groups are created even with auto-creation off (isSysConsumerGroup).
SYS_GROUP_PREFIX = "CID_RMQ_SYS_"
#: Validators.CHARACTER_MAX_LENGTH and VALID_PATTERN_STR, as mqadmin checks group names.
_GROUP_RE = re.compile(r"[%|a-zA-Z0-9_-]+")
_MAX_NAME = 255


@dataclass(frozen=True, slots=True)
class SubscriptionGroupConfig:
    """RocketMQ 4.x SubscriptionGroupConfig, its defaults."""

    group_name: str
    consume_enable: bool = True
    consume_from_min_enable: bool = True
    consume_broadcast_enable: bool = True
    retry_queue_nums: int = 1
    retry_max_times: int = 16
    broker_id: int = 0  # MixAll.MASTER_ID
    which_broker_when_consume_slowly: int = 1
    notify_consumer_ids_changed_enable: bool = True

    def to_wire(self) -> dict[str, Any]:
        return {wire: getattr(self, name) for name, wire in FIELDS.items()}

    @classmethod
    def from_wire(cls, doc: object, *, default_retry_max_times: int = 16,
                  check_name: bool = True) -> SubscriptionGroupConfig:
        """A config from its JSON (fields left out take their defaults), every field type-checked."""
        if not isinstance(doc, dict):
            raise InvalidParameterError(f"a SubscriptionGroupConfig is a JSON object, not {type(doc).__name__}")
        unknown = sorted(set(doc) - set(FIELDS.values()) - _IGNORED)
        if unknown:
            raise InvalidParameterError(f"unknown SubscriptionGroupConfig field(s) {unknown}; known: "
                                        f"{sorted(FIELDS.values())}")
        kw: dict[str, Any] = {"retry_max_times": default_retry_max_times}
        for name, wire in FIELDS.items():
            if wire not in doc:
                continue
            v = doc[wire]
            want = _TYPES[name]
            if want is bool and isinstance(v, str) and v.lower() in ("true", "false"):
                v = v.lower() == "true"
            elif want is int and isinstance(v, str) and re.fullmatch(r"-?\d+", v):
                v = int(v)
            if type(v) is not want:
                kind = {bool: "true or false", int: "an integer", str: "a string"}[want]
                raise InvalidParameterError(f"SubscriptionGroupConfig.{wire} must be {kind}, got {v!r}")
            kw[name] = v
        if "group_name" not in kw:
            raise InvalidParameterError("SubscriptionGroupConfig needs groupName")
        return cls(**kw).validate(check_name)

    def validate(self, check_name: bool = True) -> SubscriptionGroupConfig:
        """Numbers in range; with ``check_name`` the name as mqadmin checks it (auto-created names are not)."""
        if check_name:
            check_group(self.group_name)
        for name in ("retry_queue_nums", "retry_max_times", "broker_id", "which_broker_when_consume_slowly"):
            v = getattr(self, name)
            if not 0 <= v <= 2**31 - 1:
                raise InvalidParameterError(f"SubscriptionGroupConfig.{FIELDS[name]} must be 0..2147483647, "
                                            f"got {v}")
        if self.retry_queue_nums > 1024:
            raise InvalidParameterError(f"SubscriptionGroupConfig.retryQueueNums must be at most 1024 (the "
                                        f"topics' queue limit), got {self.retry_queue_nums}")
        return self


def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(p.title() for p in rest)


#: field -> its JSON name (RocketMQ's getters: groupName, consumeEnable, ...)
FIELDS: dict[str, str] = {f.name: _camel(f.name) for f in dataclasses.fields(SubscriptionGroupConfig)}
_TYPES: dict[str, type] = {f.name: (bool if f.type == "bool" else int if f.type == "int" else str)
                           for f in dataclasses.fields(SubscriptionGroupConfig)}
#: Fields newer RocketMQ versions write, accepted and not kept (5.x: groupRetryPolicy, groupSysFlag, ...).
_IGNORED = {"groupRetryPolicy", "groupSysFlag", "consumeTimeoutMinute", "consumeMessageOrderly", "subscriptionDataSet",
            "attributes"}


def check_group(group: str) -> str:
    if not isinstance(group, str) or not group:
        raise InvalidParameterError("the consumer group name is empty")
    if len(group) > _MAX_NAME:
        raise InvalidParameterError(f"the consumer group name is longer than {_MAX_NAME} characters")
    if not _GROUP_RE.fullmatch(group):
        raise InvalidParameterError(f"the consumer group name {group!r} contains characters outside "
                                    "[%|a-zA-Z0-9_-]")
    return group


class SubscriptionGroupManager:
    """Thread-safe table of subscription groups with a data version bumped on every change."""

    def __init__(self, config_dir: Path, *, auto_create: bool = True, default_retry_max_times: int = 16) -> None:
        self._path = config_dir / "subscriptionGroup.json"
        self._lock = threading.RLock()
        self._groups: dict[str, SubscriptionGroupConfig] = {}
        self._saver = JsonSaver(self._path, self.to_wire, self._lock, "subgroups-saver")
        self.auto_create = auto_create
        #: retryMaxTimes of auto-created groups (the broker's max_reconsume_times; RocketMQ's fixed 16)
        self.default_retry_max_times = default_retry_max_times
        self.data_version = {"timestamp": int(time.time() * 1000), "counter": 0}
        self._load()
        missing = [g for g in SYSTEM_GROUPS if g not in self._groups]
        if missing:
            with self._lock:
                for g in missing:
                    self._groups[g] = SubscriptionGroupConfig(g, retry_max_times=self.default_retry_max_times)
                self._persist()

    def _load(self) -> None:
        data = read_json(self._path, default={}) or {}
        table = data.get("subscriptionGroupTable", {})
        if not isinstance(table, dict):
            raise InvalidParameterError(f"{self._path}: subscriptionGroupTable is not an object")
        for name, doc in table.items():
            try:
                cfg = SubscriptionGroupConfig.from_wire({"groupName": name, **doc}, check_name=False)
            except InvalidParameterError as exc:
                raise InvalidParameterError(f"{self._path}: group {name!r}: {exc}") from None
            self._groups[name] = cfg
        if isinstance(data.get("dataVersion"), dict):
            self.data_version = dict(data["dataVersion"])

    def _persist(self, *, soon: bool = False) -> None:
        """Bump the data version and save: at once, or (``soon``) on the saver's thread for a group a
        client's heartbeat auto-creates (the event loop never waits on its fsyncs; made again if lost)."""
        self.data_version = {"timestamp": int(time.time() * 1000), "counter": self.data_version["counter"] + 1}
        if soon:
            self._saver.soon()
        else:
            self._saver.now()

    def flush(self) -> None:
        """Write an auto-creation still waiting for the saver (broker stop)."""
        self._saver.flush()

    def to_wire(self) -> dict[str, Any]:
        """SubscriptionGroupWrapper: GET_ALL_SUBSCRIPTIONGROUP_CONFIG's body and the file's content."""
        with self._lock:
            return {"subscriptionGroupTable": {n: c.to_wire() for n, c in sorted(self._groups.items())},
                    "dataVersion": dict(self.data_version)}

    def get(self, group: str) -> SubscriptionGroupConfig | None:
        return self._groups.get(group)

    def all(self) -> list[SubscriptionGroupConfig]:
        with self._lock:
            return list(self._groups.values())

    def update(self, cfg: SubscriptionGroupConfig) -> SubscriptionGroupConfig:
        """Create or replace a group (UPDATE_AND_CREATE_SUBSCRIPTIONGROUP)."""
        cfg.validate()
        with self._lock:
            self._groups[cfg.group_name] = cfg
            self._persist()
        return cfg

    def delete(self, group: str) -> bool:
        with self._lock:
            if self._groups.pop(group, None) is None:
                return False
            self._persist()
            return True

    def find(self, group: str, *, create: bool = True) -> SubscriptionGroupConfig | None:
        """The group's config (findSubscriptionGroupConfig). Unknown: created when auto-creation is on or the
        group is a system one (``create``), else the defaults unpersisted (``create`` False); None when
        auto-creation is off."""
        cfg = self._groups.get(group)
        if cfg is not None:
            return cfg
        if not self.serves_unknown(group):
            return None
        # Not validated: RocketMQ creates whatever name a client uses (its retry topic is checked where made).
        cfg = SubscriptionGroupConfig(group, retry_max_times=self.default_retry_max_times)
        if not create:
            return cfg
        with self._lock:
            existing = self._groups.get(group)
            if existing is not None:
                return existing
            self._groups[group] = cfg
            self._persist(soon=True)
        return cfg

    def serves_unknown(self, group: str) -> bool:
        """Whether a group without a config is served with the defaults (auto-creation on, or a system group)."""
        return self.auto_create or group.startswith(SYS_GROUP_PREFIX)

    def require(self, group: str, *, create: bool = True) -> SubscriptionGroupConfig:
        """``find``, raising RocketMQ's SUBSCRIPTION_GROUP_NOT_EXIST answer for an unknown group."""
        cfg = self.find(group, create=create)
        if cfg is None:
            raise not_exist(group)
        return cfg


def not_exist(group: str) -> SubscriptionGroupNotExistError:
    return SubscriptionGroupNotExistError(
        f"subscription group [{group}] does not exist, and auto_create_subscription_group is off; create "
        f"it with `sluice admin updateSubGroup -g {group}`")


class SubscriptionGroupProcessor:
    """UPDATE_AND_CREATE_SUBSCRIPTIONGROUP (200), GET_ALL_SUBSCRIPTIONGROUP_CONFIG (201) and
    DELETE_SUBSCRIPTIONGROUP (207), as RocketMQ's AdminBrokerProcessor answers them."""

    def __init__(self, *, subgroups: SubscriptionGroupManager,
                 remove_offsets: Callable[[str], None]) -> None:
        self.subgroups = subgroups
        self.remove_offsets = remove_offsets  # every committed offset of a group (removeOffset)

    async def update(self, conn: RemotingConnection, request: RemotingCommand) -> RemotingCommand:
        if not request.body:
            raise InvalidParameterError("UPDATE_AND_CREATE_SUBSCRIPTIONGROUP without a SubscriptionGroupConfig body")
        doc = loads_lenient(request.body)
        sg = self.subgroups
        cfg = sg.update(SubscriptionGroupConfig.from_wire(doc, default_retry_max_times=sg.default_retry_max_times))
        log.info("subscription group %s updated by %s: %s", cfg.group_name, conn.peer, cfg.to_wire())
        return request.make_response()

    async def get_all(self, conn: RemotingConnection, request: RemotingCommand) -> RemotingCommand:
        return request.make_response(body=orjson.dumps(self.subgroups.to_wire()))

    async def delete(self, conn: RemotingConnection, request: RemotingCommand) -> RemotingCommand:
        h = DeleteSubscriptionGroupRequestHeader.from_command(request)
        existed = self.subgroups.delete(h.group_name)
        if h.remove_offset:
            self.remove_offsets(h.group_name)
        log.info("subscription group %s deleted by %s (%s; offsets %s)", h.group_name, conn.peer,
                 "existed" if existed else "did not exist", "removed" if h.remove_offset else "kept")
        return request.make_response()
