"""The options of ``format("sluice")``, checked once where Spark plans the query.

Names follow Spark's Kafka source where the meaning is the same (``subscribe``,
``subscribePattern``, ``startingOffsets``, ``endingOffsets``, ``maxOffsetsPerTrigger``,
``failOnDataLoss``, ``minPartitions``). Offsets JSON is keyed by topic, then queue,
as Kafka's is by topic, then partition: ``{"Orders": {"broker-a:0": 400}}``, or
``{"Orders": {"0": 400}}`` when the topic lives on one broker; -2 is earliest and
-1 latest. A key that names no topic, broker or queue of the subscription is an
error (resolved against the route in :func:`resolve_table`). Options nobody reads
are reported in a warning: a typo is the usual cause.
"""
from __future__ import annotations

import functools
import logging
import re
import uuid
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

import orjson

from sluice.errors import InvalidParameterError, SluiceError

log = logging.getLogger(__name__)

F = TypeVar("F", bound=Callable[..., Any])


def short_errors(fn: F) -> F:
    """Re-raise Sluice's errors without the frames that found them: Spark prints the Python traceback
    inside its own message, and the error's one line is what the user needs there."""
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except SluiceError as exc:
            raise exc.with_traceback(None) from None
    return wrapper  # type: ignore[return-value]

EARLIEST, LATEST = -2, -1

#: Every option the reader understands (compared case-insensitively: Spark hands them over lower-cased).
READ_OPTIONS = (
    "namesrv", "topic", "subscribe", "subscribePattern", "selectorType", "selector", "startingOffsets",
    "endingOffsets", "startingTimestamp", "endingTimestamp", "maxOffsetsPerTrigger", "failOnDataLoss",
    "minPartitions", "pullBatchSize", "group", "broker", "accessKey", "secretKey", "path")
#: TLS to namesrvs and brokers (sluice.ClientConfig's tls, tls_ca, ...), read and written alike.
TLS_OPTIONS = ("tls", "tlsCa", "tlsServerName", "tlsVerify", "tlsCert", "tlsKey")
READ_OPTIONS += TLS_OPTIONS
#: Every option the writer understands.
WRITE_OPTIONS = ("namesrv", "topic", "writeId", "accessKey", "secretKey", "path", "checkpointLocation",
                 *TLS_OPTIONS)


def warn_unknown(options: Mapping[str, str], known: tuple[str, ...], what: str) -> list[str]:
    """Names in ``options`` that ``known`` lacks: one warning line (logged: it runs in Spark's planner
    process, whose stderr is the driver's), returned sorted."""
    lower = {k.lower() for k in known}
    unknown = sorted(k for k in options if k.lower() not in lower)
    if unknown:
        log.warning("format('sluice') %s ignores unknown option(s) %s (a typo?); known: %s", what,
                    ", ".join(unknown), ", ".join(known))
    return unknown


def credentials(options: Mapping[str, str]):
    """``accessKey`` + ``secretKey`` as sluice.acl Credentials (None when neither is given)."""
    ak, sk = options.get("accessKey"), options.get("secretKey")
    if not ak and not sk:
        return None
    if not ak or not sk:
        raise InvalidParameterError("format('sluice') needs both accessKey and secretKey (an ACL account)")
    from sluice.acl.signature import Credentials

    return Credentials(ak, sk)


def bool_opt(options: Mapping[str, str], name: str, default: bool) -> bool:
    raw = options.get(name)
    if raw is None or raw == "":
        return default
    value = str(raw).strip().lower()
    if value not in ("true", "false"):
        raise InvalidParameterError(f"option {name} must be true or false, not {raw!r}")
    return value == "true"


def tls_options(options: Mapping[str, str]) -> dict[str, Any]:
    """``tls`` (true/false), ``tlsCa``, ``tlsServerName``, ``tlsVerify``, ``tlsCert`` + ``tlsKey`` as the
    ClientConfig keywords the source's clients take ({} for plain TCP). The files are read here once, so a
    wrong path is one clear line on the driver; tasks read them again (the paths must exist where they run)."""
    on = bool_opt(options, "tls", False)
    ca, name = options.get("tlsCa") or None, options.get("tlsServerName") or None
    cert, key = options.get("tlsCert") or None, options.get("tlsKey") or None
    verify = bool_opt(options, "tlsVerify", True)
    if not on:
        given = [k for k in TLS_OPTIONS[1:] if options.get(k)]
        if given:
            raise InvalidParameterError(f"format('sluice') option(s) {', '.join(given)} need tls=true")
        return {}
    if bool(cert) != bool(key):
        raise InvalidParameterError("format('sluice') needs both tlsCert and tlsKey (a client certificate)")
    from sluice.transport.tls import ClientTls

    ClientTls(ca=ca, server_name=name, verify=verify, cert=cert, key=key).context()
    return {"tls": True, "tls_ca": ca, "tls_server_name": name, "tls_verify": verify, "tls_cert": cert,
            "tls_key": key}


def int_opt(options: Mapping[str, str], name: str) -> int | None:
    raw = options.get(name)
    if raw is None or raw == "":
        return None
    try:
        return int(raw)
    except ValueError:
        raise InvalidParameterError(f"option {name} must be an integer, not {raw!r}") from None


#: {topic: {queue key as written ("broker-a:0" or "0"): offset}}
OffsetTable = dict[str, dict[str, int]]


def parse_offsets(spec: str, what: str, *, ending: bool = False) -> OffsetTable | str:
    """``earliest`` / ``latest`` as is, else the JSON table (checked for shape, not yet against routes)."""
    s = spec.strip()
    if s.lower() in ("earliest", "latest"):
        if ending and s.lower() == "earliest":
            raise InvalidParameterError(f"{what} cannot be earliest (as in Kafka's source)")
        return s.lower()
    example = '{"Orders": {"broker-a:0": 400}} or {"Orders": {"0": 400}}'
    try:
        data = orjson.loads(s)
    except orjson.JSONDecodeError:
        raise InvalidParameterError(f"{what} must be earliest, latest or JSON like {example}, not {spec!r}") \
            from None
    if not isinstance(data, dict) or not data:
        raise InvalidParameterError(f"{what} JSON must map topics to queues, like {example}, not {spec!r}")
    out: OffsetTable = {}
    for topic, queues in data.items():
        if not isinstance(queues, dict):
            raise InvalidParameterError(f"{what}: topic {topic!r} must map to {{queue: offset}}, like {example} "
                                        f"(the broker-then-queue form of older versions is gone)")
        table: dict[str, int] = {}
        for q, off in queues.items():
            if isinstance(off, bool) or not isinstance(off, int) or off < EARLIEST:
                raise InvalidParameterError(f"{what}: {topic}/{q} must be an offset >= 0, -2 (earliest) or "
                                            f"-1 (latest), not {off!r}")
            if ending and off == EARLIEST:
                raise InvalidParameterError(f"{what}: {topic}/{q} cannot be -2 (earliest)")
            table[str(q)] = off
        out[str(topic)] = table
    return out


def resolve_table(table: OffsetTable, what: str, queues_by_topic: Mapping[str, Iterable[tuple[str, int]]]
                  ) -> dict[tuple[str, str, int], int]:
    """The table's entries as {(topic, broker, queue id): offset}, every key checked against the route:
    an unknown topic, broker or queue is an error naming it; a bare queue id needs a one-broker topic."""
    out: dict[tuple[str, str, int], int] = {}
    for topic, entries in table.items():
        if topic not in queues_by_topic:
            raise InvalidParameterError(f"{what} names topic {topic!r}, which this query does not read "
                                        f"(it reads {', '.join(sorted(queues_by_topic)) or 'nothing'})")
        queues = sorted(set(queues_by_topic[topic]))
        brokers = sorted({b for b, _ in queues})
        for key, off in entries.items():
            broker, sep, qid_s = key.rpartition(":")
            if not sep:
                if len(brokers) != 1:
                    raise InvalidParameterError(
                        f"{what}: queue {key!r} of topic {topic!r} is ambiguous: the topic lives on brokers "
                        f"{', '.join(brokers)}; write \"<broker>:{key}\"")
                broker = brokers[0]
            elif broker not in brokers:
                raise InvalidParameterError(f"{what}: topic {topic!r} has no broker {broker!r} "
                                            f"(its brokers: {', '.join(brokers)})")
            try:
                qid = int(qid_s)
            except ValueError:
                raise InvalidParameterError(f"{what}: {key!r} is not a queue of topic {topic!r} "
                                            "(write \"<broker>:<queue id>\" or \"<queue id>\")") from None
            if (broker, qid) not in queues:
                have = [q for b, q in queues if b == broker]
                raise InvalidParameterError(f"{what}: topic {topic!r} has no queue {qid} on broker {broker!r} "
                                            f"(its readable queues there: {min(have)}..{max(have)})")
            out[(topic, broker, qid)] = off
    return out


@dataclass(frozen=True)
class Subscription:
    """What to read: explicit topics, or a pattern matched against the namesrv's topic list."""

    topics: tuple[str, ...]
    pattern: str | None

    def describe(self) -> str:
        return f"pattern {self.pattern}" if self.pattern else ",".join(self.topics)


def subscription(options: Mapping[str, str]) -> Subscription:
    given = [k for k in ("topic", "subscribe", "subscribePattern") if options.get(k)]
    if not given:
        raise InvalidParameterError("reading format('sluice') needs one of the options topic, subscribe "
                                    "(comma-separated topics) or subscribePattern (a regular expression)")
    if len(given) > 1:
        raise InvalidParameterError(f"give only one of the options topic, subscribe, subscribePattern "
                                    f"(got {', '.join(given)})")
    if given[0] == "subscribePattern":
        pattern = options.get("subscribePattern")
        try:
            re.compile(pattern)
        except re.error as exc:
            raise InvalidParameterError(f"subscribePattern {pattern!r} is not a regular expression: {exc}") \
                from None
        return Subscription((), pattern)
    raw = options.get(given[0])
    topics = tuple(dict.fromkeys(t.strip() for t in raw.split(",") if t.strip()))
    if not topics:
        raise InvalidParameterError(f"option {given[0]} names no topic: {raw!r}")
    if given[0] == "topic" and len(topics) > 1:
        raise InvalidParameterError(f"option topic takes one topic; read several with subscribe={raw!r}")
    return Subscription(topics, None)


class Options:
    """The reader's options, checked on the driver side before any task runs."""

    def __init__(self, options: Mapping[str, str], *, streaming: bool = False) -> None:
        from sluice.spark.selector import check_selector, reads_as_sql92

        self.namesrv = options.get("namesrv")
        if not self.namesrv:
            raise InvalidParameterError("format('sluice') needs option namesrv (host:port[;host:port])")
        self.subscription = subscription(options)
        self.selector_type = (options.get("selectorType") or "TAG").upper()
        if self.selector_type not in ("TAG", "SQL92"):
            raise InvalidParameterError(f"selectorType must be TAG or SQL92, not {self.selector_type!r}")
        self.selector = options.get("selector") or ("*" if self.selector_type == "TAG" else None)
        check_selector(self.selector_type, self.selector)  # one clear line before any task runs
        if not options.get("selectorType") and self.selector and reads_as_sql92(self.selector):
            # A tag expression may hold any text, so "region = 'eu'" would be one odd tag matching nothing:
            # the default type is a trap for a SQL92 selector, so it must be named.
            raise InvalidParameterError(
                f"selector {self.selector!r} reads as SQL92, but selectorType defaults to TAG (a tag "
                "expression such as 'TagA || TagB'), which would match no message: set selectorType=SQL92 "
                "(or selectorType=TAG if it really is a tag)")
        self.starting = parse_offsets(options.get("startingOffsets") or ("latest" if streaming else "earliest"),
                                      "startingOffsets")
        self.ending = parse_offsets(options.get("endingOffsets") or "latest", "endingOffsets", ending=True)
        for spec, what in ((self.starting, "startingOffsets"), (self.ending, "endingOffsets")):
            extra = sorted(set(spec) - set(self.subscription.topics)) \
                if isinstance(spec, dict) and self.subscription.pattern is None else []
            if extra:
                raise InvalidParameterError(f"{what} names topic {extra[0]!r}, which this query does not read "
                                            f"(it reads {', '.join(self.subscription.topics)})")
        self.starting_ts = int_opt(options, "startingTimestamp")
        self.ending_ts = int_opt(options, "endingTimestamp")
        self.max_per_trigger = int_opt(options, "maxOffsetsPerTrigger")
        if self.max_per_trigger is not None and self.max_per_trigger <= 0:
            raise InvalidParameterError("maxOffsetsPerTrigger must be positive")
        self.fail_on_data_loss = (options.get("failOnDataLoss") or "true").lower() != "false"
        self.min_partitions = int_opt(options, "minPartitions") or 0
        self.pull_batch = int_opt(options, "pullBatchSize") or 256  # the broker caps a pull by bytes
        if self.pull_batch <= 0:
            raise InvalidParameterError("pullBatchSize must be positive")
        self.group = options.get("group") or f"spark-sluice-{uuid.uuid4().hex[:12]}"
        self.broker_label = options.get("broker")
        self.credentials = credentials(options)
        #: ClientConfig keywords for TLS ({}: plain TCP); BrokerSession takes them.
        self.tls = tls_options(options)

    @property
    def topic(self) -> str | None:
        """The one topic read (None for several or a pattern)."""
        t = self.subscription.topics
        return t[0] if len(t) == 1 else None

    def describe(self) -> str:
        """Sluice, topics and selector: how progress reports and errors name this source."""
        return f"Sluice[{self.subscription.describe()} {self.selector_type}:{self.selector}]"
