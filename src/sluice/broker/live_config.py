"""The broker's settings as RocketMQ's GET_BROKER_CONFIG shows them, and the ones UPDATE_BROKER_CONFIG may change.

GET_BROKER_CONFIG (26) answers a Java properties text, one ``name=value`` a
line (RocketMQ's ``Configuration.getAllConfigsFormatString``), with the
configuration's DataVersion JSON in the ``version`` header field
(broker/src/main/java/org/apache/rocketmq/broker/processor/AdminBrokerProcessor.java,
getBrokerConfig). Settings are named as RocketMQ's BrokerConfig /
MessageStoreConfig where one exists (``brokerClusterName``, ``namesrvAddr``,
``flushDiskType`` ...), otherwise as the camelCase of Sluice's own name. The
ACL secret key is never shown.

UPDATE_BROKER_CONFIG (25) takes the same text. Only the settings in LIVE
change a running broker: each is read per request (or per check-back round) by
the part that uses it. Any other known setting is refused with NO_PERMISSION
naming it (RocketMQ refuses its black-listed ones the same way); an unknown
name or a bad value is INVALID_PARAMETER. Nothing changes unless the whole
update is accepted.

Accepted changes persist, as RocketMQ's do (Configuration.update then persist(),
which rewrites the broker's config file:
remoting/src/main/java/org/apache/rocketmq/remoting/Configuration.java): every
setting changed live so far is kept in ``<store>/config/liveConfig.json``
(:class:`LiveConfigFile`, written atomically before the change applies), and a
starting broker puts those values over its command line and TOML ones, logging
which it overrode. The TOML file itself is never rewritten.
"""
from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Protocol

from sluice.broker.config import BrokerConfig
from sluice.errors import InvalidParameterError, NoPermissionError, SluiceError
from sluice.persist import read_json, write_json_atomic

__all__ = ["LIVE", "ConfigVersion", "LiveConfigFile", "LiveTargets", "apply_checked", "apply_update",
           "check_update", "config_properties", "parse_properties", "wire_name"]

log = logging.getLogger(__name__)

#: Where the live changes are kept, in the store's config directory (beside topics.json).
LIVE_FILE_NAME = "liveConfig.json"

#: Sluice setting -> RocketMQ's property name, where RocketMQ has the same setting.
ROCKETMQ_NAMES = {
    "cluster_name": "brokerClusterName", "broker_name": "brokerName", "broker_id": "brokerId",
    "namesrv": "namesrvAddr", "store": "storePathRootDir", "flush": "flushDiskType",
    "auto_create_topic": "autoCreateTopicEnable", "default_topic_queue_nums": "defaultTopicQueueNums",
    "enable_property_filter": "enablePropertyFilter", "enable_calc_filter_bitmap": "enableCalcFilterBitMap",
    "expect_consumer_num_use_filter": "expectConsumerNumUseFilter",
    "max_error_rate_of_bloom_filter": "maxErrorRateOfBloomFilter",
    "filter_data_clean_time_span_ms": "filterDataCleanTimeSpan", "long_polling_enable": "longPollingEnable",
    "short_polling_ms": "shortPollingTimeMills", "max_transfer_bytes": "maxTransferBytesOnMessageInMemory",
    "max_transfer_count": "maxTransferCountOnMessageInMemory",
    "register_namesrv_period_ms": "registerNameServerPeriod",
    "persist_offsets_interval_ms": "flushConsumerOffsetInterval", "max_message_size": "maxMessageSize",
    "commitlog_file_size": "mappedFileSizeCommitLog", "retention_hours": "fileReservedTime",
    "message_delay_level": "messageDelayLevel", "reject_transaction_message": "rejectTransactionMessage",
    "transaction_timeout_ms": "transactionTimeOut", "transaction_check_interval_ms": "transactionCheckInterval",
    "transaction_check_max": "transactionCheckMax", "disk_max_used_space_ratio": "diskMaxUsedSpaceRatio",
    "filter_server_nums": "filterServerNums",
    "server_channel_max_idle_time_seconds": "serverChannelMaxIdleTimeSeconds",
}
#: Never shown: a secret.
HIDDEN = frozenset({"acl_secret_key"})


class LiveTargets(Protocol):
    """What an update reaches: the broker's parts that read the live settings (BrokerController)."""

    config: BrokerConfig
    topics: Any
    send_processor: Any
    retry_processor: Any
    subgroups: Any
    transactions: Any
    pull_processor: Any


def _pull_config(b: LiveTargets, name: str, value: object) -> None:
    b.pull_processor.config = b.config  # the pull path reads its settings from this object per request


def _setter(*where: tuple[str, str]) -> Callable[[LiveTargets, str, object], None]:
    def apply(b: LiveTargets, name: str, value: object) -> None:
        for part, attr in where:
            setattr(getattr(b, part), attr, value)
    return apply


#: Settings a running broker takes at once, and how each reaches the part that reads it.
LIVE: dict[str, Callable[[LiveTargets, str, object], None]] = {
    "auto_create_topic": _setter(("topics", "auto_create")),
    "max_auto_created_topics": _setter(("topics", "max_auto_created")),
    # The retryMaxTimes of subscription groups auto-created from now on (a group's own is updateSubGroup -r).
    "max_reconsume_times": _setter(("subgroups", "default_retry_max_times")),
    "reject_transaction_message": _setter(("send_processor", "reject_transactions")),
    "transaction_timeout_ms": _setter(("transactions", "timeout_ms")),
    "transaction_check_interval_ms": _setter(("transactions", "check_interval_ms")),
    "transaction_check_max": _setter(("transactions", "check_max")),
    "max_evaluations_per_pull": _pull_config,
    "max_transfer_bytes": _pull_config,
    "max_transfer_count": _pull_config,
    "long_polling_enable": _pull_config,
    "short_polling_ms": _pull_config,
    "pull_on_event_loop": _pull_config,
}


def wire_name(setting: str) -> str:
    """The name GET_BROKER_CONFIG shows ``setting`` under."""
    if setting in ROCKETMQ_NAMES:
        return ROCKETMQ_NAMES[setting]
    head, *rest = setting.split("_")
    return head + "".join(p[:1].upper() + p[1:] for p in rest)


_FIELDS = {f.name: f for f in dataclasses.fields(BrokerConfig)}
#: Every accepted name (wire name or Sluice's snake_case) -> the setting.
_BY_NAME = {**{wire_name(n): n for n in _FIELDS if n not in HIDDEN}, **{n: n for n in _FIELDS if n not in HIDDEN},
            "brokerIP1": "listen", "listenPort": "listen"}


def _show(setting: str, value: object) -> str:
    if setting == "flush":
        return "SYNC_FLUSH" if value == "sync" else "ASYNC_FLUSH"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list):
        return ";".join(str(v) for v in value)
    if isinstance(value, tuple):
        return ",".join(str(v) for v in value)
    return "" if value is None else str(value)


def config_properties(config: BrokerConfig) -> dict[str, str]:
    """Every setting by its wire name, as text (``listen`` also as RocketMQ's ``brokerIP1`` / ``listenPort``)."""
    out = {wire_name(n): _show(n, getattr(config, n)) for n in _FIELDS if n not in HIDDEN}
    host, port = config.host_port
    out["brokerIP1"], out["listenPort"] = host, str(port)
    return dict(sorted(out.items()))


def parse_properties(text: str) -> dict[str, str]:
    """``name=value`` lines (Java properties: ``#``/``!`` comments, ``=`` or ``:``, blank lines skipped)."""
    out: dict[str, str] = {}
    for n, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line or line[0] in "#!":
            continue
        cut = min((i for i in (line.find("="), line.find(":")) if i >= 0), default=-1)
        if cut <= 0:
            raise InvalidParameterError(f"line {n} of the config update is not name=value: {line!r}")
        out[line[:cut].strip()] = line[cut + 1:].strip()
    return out


def _convert(setting: str, text: str) -> object:
    kind = _FIELDS[setting].type
    if kind in ("bool", bool):
        if text.lower() not in ("true", "false"):
            raise InvalidParameterError(f"{wire_name(setting)} must be true or false, got {text!r}")
        return text.lower() == "true"
    try:
        if kind in ("int", int):
            return int(text)
        if kind in ("float", float):
            return float(text)
    except ValueError:
        raise InvalidParameterError(f"{wire_name(setting)} must be a number, got {text!r}") from None
    return text


def check_update(config: BrokerConfig, props: Mapping[str, str]) -> tuple[dict[str, object], BrokerConfig]:
    """The settings ``props`` changes (Sluice names -> values) and the config they make, or the refusal."""
    unknown = sorted(k for k in props if k not in _BY_NAME)
    if unknown:
        raise InvalidParameterError(f"unknown broker setting(s): {', '.join(unknown)}")
    settings = {_BY_NAME[k]: v for k, v in props.items()}
    fixed = sorted(wire_name(s) for s in settings if s not in LIVE)
    if fixed:
        live = ", ".join(sorted(wire_name(s) for s in LIVE))
        raise NoPermissionError(f"broker setting(s) {', '.join(fixed)} cannot change while the broker runs "
                                f"(restart it with the new value); these can: {live}")
    changes = {s: _convert(s, v) for s, v in settings.items()}
    try:
        new = dataclasses.replace(config, **changes).validate()  # refuses bad values before any change
    except InvalidParameterError as exc:
        asked = ", ".join(f"{wire_name(k)}={v}" for k, v in settings.items())
        raise InvalidParameterError(f"{asked} refused: {exc}") from None
    return changes, new


def apply_checked(target: LiveTargets, changes: Mapping[str, object], new: BrokerConfig) -> None:
    """Make ``target`` run with ``new``: each changed setting reaches the part that reads it."""
    target.config = new
    for s, value in changes.items():
        LIVE[s](target, s, value)


def apply_update(target: LiveTargets, props: Mapping[str, str]) -> dict[str, object]:
    """Check the whole update, then apply it to ``target``; returns the settings changed (Sluice names)."""
    changes, new = check_update(target.config, props)
    apply_checked(target, changes, new)
    return changes


class LiveConfigFile:
    """The settings changed live, kept across restarts: ``{"settings": {wireName: text}}``, cumulative.

    Stored as the same text an update carries, so a starting broker checks each kept value exactly as
    UPDATE_BROKER_CONFIG would (a setting no longer live, unknown or invalid is logged and left out).
    """

    def __init__(self, config_dir: Path) -> None:
        self.path = config_dir / LIVE_FILE_NAME

    def kept(self) -> dict[str, str]:
        """The kept settings as wireName -> text (empty without the file)."""
        doc = read_json(self.path, {})
        settings = doc.get("settings") if isinstance(doc, dict) else None
        if not isinstance(settings, dict):
            if doc:
                log.error("%s has no \"settings\" object; starting without its live settings", self.path)
            return {}
        return {str(k): str(v) for k, v in settings.items()}

    def save(self, changes: Mapping[str, object]) -> None:
        """Add ``changes`` (Sluice names -> values) to the kept settings, replacing the file atomically."""
        settings = self.kept()
        settings.update({wire_name(s): _show(s, v) for s, v in changes.items()})
        write_json_atomic(self.path, {"settings": dict(sorted(settings.items()))})

    def overlay(self, config: BrokerConfig) -> BrokerConfig:
        """``config`` with the kept settings over it; logs which values it overrode and what it left out."""
        overridden: list[str] = []
        for name, text in self.kept().items():
            try:
                changes, new = check_update(config, {name: text})
            except SluiceError as exc:
                log.error("%s: %s=%s left out: %s", self.path, name, text, exc)
                continue
            for s, value in changes.items():
                if value != getattr(config, s):  # a kept value the TOML / command line now also gives is no news
                    overridden.append(f"{wire_name(s)}={_show(s, value)} (was {_show(s, getattr(config, s))})")
            config = new
        if overridden:
            log.info("settings changed live by updateBrokerConfig (kept in %s) override the command line / "
                     "TOML values: %s", self.path, ", ".join(overridden))
        return config


class ConfigVersion:
    """The configuration's DataVersion (RocketMQ's Configuration.dataVersion): bumped by every update."""

    def __init__(self) -> None:
        self.timestamp = int(time.time() * 1000)
        self.counter = 0

    def next(self) -> None:
        self.timestamp = int(time.time() * 1000)
        self.counter += 1

    def to_wire(self) -> dict[str, int]:
        return {"timestamp": self.timestamp, "counter": self.counter}
