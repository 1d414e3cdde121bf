"""Hypothesis over frames and headers, as h11 is fuzzed: against the sans-IO codec (whole, byte by byte and in
random chunks: every input decodes to the same frames or raises the codec's own ProtocolError, never anything
else, never loops), against the typed headers and bodies (decoded or InvalidParameterError naming the field),
and against a live broker subprocess and its namesrv (a connection sending malformed frames or requests gets a
precise answer or is closed and logged, while a normal SDK client on another connection is served throughout)."""
from __future__ import annotations

import dataclasses
import json
import socket
import struct
import time
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from servers import Cluster, running_cluster

from sluice import Message, Producer, PullConsumer
from sluice.broker.requests import ROUTES  # the broker's own table: every code it serves is fuzzed
from sluice.errors import ProtocolError, SluiceError
from sluice.protocol import bodies as B
from sluice.protocol import fields as F
from sluice.protocol import headers as H
from sluice.protocol.codes import RequestCode, ResponseCode
from sluice.protocol.command import FLAG_ONEWAY, FLAG_RESPONSE, RemotingCommand, SerializeType
from sluice.protocol.frame import DEFAULT_MAX_FRAME_SIZE, NEED_DATA, FrameCodec, encode_frame

MAX_FRAME = 64 * 1024

# ---- strategies ----------------------------------------------------------------------------------------
json_scalars = (st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.floats(allow_nan=False)
                | st.text(max_size=12))
json_values = st.recursive(json_scalars, lambda inner: st.lists(inner, max_size=4)
                           | st.dictionaries(st.text(max_size=8), inner, max_size=4), max_leaves=12)
def _plausible(f: Any) -> str:
    tp = f.tp
    if tp is bool:
        return "false"
    if tp is int:
        return {"maxMsgNums": "32", "writeQueueNums": "4", "readQueueNums": "4", "perm": "6"}.get(f.wire, "0")
    if f.enum:
        return f.enum[0]
    return {"consumerGroup": "FuzzG", "group": "FuzzG", "producerGroup": "FuzzPG", "subscription": "*",
            "expressionType": "TAG"}.get(f.wire, "FuzzT")


HEADER_TYPES = sorted((c for c in vars(H).values() if isinstance(c, type) and issubclass(c, H.Header)
                       and c is not H.Header and dataclasses.is_dataclass(c)), key=lambda c: c.__name__)
#: Every field the typed headers read, by wire name (and the V2 send header's letters), with a value that
#: parses: fuzzed requests start from these so they reach the handlers, then have fields changed or dropped.
PLAUSIBLE: dict[str, str] = {}
for _cls in HEADER_TYPES:
    for _f in F._plan(_cls):
        PLAUSIBLE.setdefault(_f.wire, _plausible(_f))
PLAUSIBLE.update({H._V2_NAMES[k]: PLAUSIBLE.get(F.camel(k), "0") for k in H._V2_NAMES})
HEADER_NAMES = sorted(PLAUSIBLE)
field_values = st.sampled_from(["", "-1", "0", "1", "2147483648", "-9223372036854775809", "99999999999999999999",
                                "true", "false", "null", "TBW102", "%RETRY%G", "a > ", "*", "TagA || TagB",
                                "1e309", " 7 ", "\x00", "\u2603" * 3, "SQL92", "a > 1 AND b = 'x'"]) \
    | st.text(max_size=16)
ext_fields = st.dictionaries(st.sampled_from(HEADER_NAMES) | st.text(max_size=6), field_values, max_size=10)


@st.composite
def header_bytes(draw: st.DrawFn) -> tuple[int, bytes]:
    """(serialize type, header bytes): well-formed commands, JSON objects with wrong types, any JSON, garbage."""
    kind = draw(st.integers(0, 4))
    if kind == 0:  # a plausible command with fuzzed fields
        doc: dict[str, Any] = {"code": draw(st.integers(-2**33, 2**33) | st.text(max_size=5) | json_values),
                               "opaque": draw(st.integers(-2**40, 2**40) | json_values),
                               "flag": draw(st.sampled_from([0, FLAG_RESPONSE, FLAG_ONEWAY]) | json_values),
                               "language": draw(st.sampled_from(["JAVA", "CPP", 7]) | json_values),
                               "version": draw(st.integers(-5, 500) | json_values),
                               "extFields": draw(ext_fields | json_values)}
        for k in draw(st.lists(st.sampled_from(sorted(doc)), max_size=3)):
            doc.pop(k, None)
        return 0, json.dumps(doc).encode()
    if kind == 1:
        return 0, json.dumps(draw(json_values)).encode()
    if kind == 2:  # a valid command in either encoding, then corrupted at one place
        cmd = RemotingCommand.request(draw(st.integers(0, 400)), draw(ext_fields), b"")
        stype = draw(st.sampled_from([0, 1]))
        raw = bytearray(encode_frame(dataclasses.replace(cmd, serialize_type=SerializeType(stype)))[8:])
        if raw and draw(st.booleans()):
            at = draw(st.integers(0, len(raw) - 1))
            raw[at:at + 2] = draw(st.binary(min_size=1, max_size=2))
        return stype, bytes(raw)
    return draw(st.integers(0, 3)), draw(st.binary(max_size=80))


@st.composite
def frames(draw: st.DrawFn) -> bytes:
    """One frame: a length prefix that mostly agrees with its parts, sometimes lies or overflows."""
    stype, header = draw(header_bytes())
    body = draw(st.binary(max_size=40))
    total = 4 + len(header) + len(body)
    header_len = len(header)
    lie = draw(st.integers(0, 9))
    if lie == 0:
        total = draw(st.integers(-2**31, 2**31 - 1))
    elif lie == 1:
        header_len = draw(st.integers(0, 0xFFFFFF))
    elif lie == 2:
        stype = draw(st.integers(0, 255))
    prefix = struct.pack(">i", total) + struct.pack(">I", (stype << 24) | header_len)
    return prefix + header + body


streams = st.lists(frames(), min_size=1, max_size=4).map(b"".join) | st.binary(max_size=120)


def decode_stream(data: bytes, cuts: list[int], eof: bool = True,
                  max_frame: int = MAX_FRAME) -> tuple[list[RemotingCommand], str | None, bool]:
    """Feed ``data`` split at ``cuts`` (then the end of the stream, with ``eof``): (frames, the ProtocolError's
    class or None, bytes left pending).
    Bounded: a frame consumes at least 8 bytes, so more next_frame calls than that is a loop."""
    codec = FrameCodec(max_frame)
    out: list[RemotingCommand] = []
    bounds = sorted({c for c in cuts if 0 < c < len(data)} | {0, len(data)})
    calls = 0
    try:
        for a, b in zip(bounds, bounds[1:]):
            codec.receive_data(data[a:b])
            while True:
                calls += 1
                assert calls <= len(data) // 8 + len(bounds) + 2, "the codec does not make progress"
                frame = codec.next_frame()
                if frame is NEED_DATA:
                    break
                assert isinstance(frame, RemotingCommand)
                out.append(frame)
        if eof:
            codec.receive_data(b"")  # end of stream
            if codec.next_frame() is not NEED_DATA:
                raise AssertionError("a frame after end of stream that was not there before")
    except ProtocolError:
        return out, "ProtocolError", False
    return out, None, codec.buffered > 0


def _same(a: list[RemotingCommand], b: list[RemotingCommand]) -> bool:
    return [(c.code, c.opaque, c.flag, c.ext_fields, bytes(c.body), c.remark) for c in a] == \
           [(c.code, c.opaque, c.flag, c.ext_fields, bytes(c.body), c.remark) for c in b]


# ---- the sans-IO codec ---------------------------------------------------------------------------------
@settings(deadline=None, max_examples=400, derandomize=True)
@given(streams, st.lists(st.integers(0, 600), max_size=8))
def test_codec_whole_byte_by_byte_and_chunked_agree(data: bytes, cuts: list[int]) -> None:
    whole = decode_stream(data, [])
    by_byte = decode_stream(data, list(range(len(data))))
    chunked = decode_stream(data, cuts)
    for other in (by_byte, chunked):
        assert _same(whole[0], other[0]) and whole[1:] == other[1:], (whole, other)


@settings(deadline=None, max_examples=300, derandomize=True)
@given(streams)
def test_decoded_frames_reencode_and_answer(data: bytes) -> None:
    """Whatever decodes can be answered: make_response and encoding raise nothing but the codec's error."""
    frames_, _, _ = decode_stream(data, [])
    for cmd in frames_:
        try:
            again = encode_frame(cmd)
            resp = cmd.make_response(ResponseCode.SYSTEM_ERROR, "x")
            encode_frame(resp)
        except ProtocolError:
            continue
        assert _same(decode_stream(again, [])[0], [cmd])


# ---- typed headers and bodies --------------------------------------------------------------------------
HEADER_CLASSES = HEADER_TYPES
BODY_CLASSES = [B.HeartbeatData, B.LockBatchRequestBody, B.UnlockBatchRequestBody, B.CheckClientRequestBody,
                B.RegisterBrokerBody, B.TopicConfigSerializeWrapper, B.KVTable, B.ConsumerListBody]


@settings(deadline=None, max_examples=400, derandomize=True)
@given(st.sampled_from(HEADER_CLASSES), ext_fields)
def test_typed_headers_decode_or_name_the_field(cls: type, ext: dict[str, str]) -> None:
    cmd = RemotingCommand.request(RequestCode.SEND_MESSAGE, ext, b"")
    try:
        cls.from_command(cmd)
    except SluiceError as exc:
        assert exc.code != ResponseCode.SYSTEM_ERROR and str(exc)


@settings(deadline=None, max_examples=300, derandomize=True)
@given(st.sampled_from(BODY_CLASSES), json_values.map(lambda v: json.dumps(v).encode()) | st.binary(max_size=60))
def test_bodies_decode_or_raise_a_precise_error(cls: type, raw: bytes) -> None:
    try:
        B.decode_body(cls, raw)
    except SluiceError as exc:
        assert exc.code != ResponseCode.SYSTEM_ERROR and str(exc)


# ---- a live broker ---------------------------------------------------------------------------------------

TOPIC = "AbuseNormal"
#: Fuzzed requests may touch any topic but the normal client's: never generated (fuzzed topics are short).
FUZZ_TOPICS = st.sampled_from(["FuzzT", "TBW102", "%RETRY%FuzzG", "SCHEDULE_TOPIC_XXXX", "", "a" * 300]) \
    | st.text(max_size=6)
#: How long a fuzzed connection waits for the broker's answers (generous: two shared cores).
WAIT_S = 8.0


class Normal:
    """A normal SDK producer on its own connection; every send must succeed while the fuzzing goes on."""

    def __init__(self, ns: str) -> None:
        self.producer = Producer("PG_abuse_normal", ns, retry_times=0)
        self.producer.start()
        self.sent: list[bytes] = []

    def send(self) -> None:
        body = f"normal-{len(self.sent)}".encode()
        r = self.producer.send(Message(TOPIC, body))
        assert r.status.name == "SEND_OK", r
        self.sent.append(body)


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Cluster, Normal]]:
    tmp = tmp_path_factory.mktemp("fuzz")
    with running_cluster(tmp, ("broker-a",)) as c:
        normal = Normal(c.ns)
        try:
            normal.send()  # creates the topic
            yield c, normal
        finally:
            normal.producer.shutdown()


@st.composite
def requests_(draw: st.DrawFn) -> bytes:
    """A well-framed request of a code the broker serves, with fuzzed fields and body."""
    route = draw(st.sampled_from(ROUTES))
    ext = dict(PLAUSIBLE) if draw(st.integers(0, 3)) else {}  # mostly: every field present and parsing
    for key in draw(st.lists(st.sampled_from(HEADER_NAMES), max_size=4)):
        ext.pop(key, None)
    ext.update(draw(ext_fields))
    for key in ("topic", "b", "originTopic"):
        if key in ext or draw(st.booleans()):
            ext[key] = draw(FUZZ_TOPICS)
    body = draw(st.binary(max_size=64) | json_values.map(lambda v: json.dumps(v).encode()))
    cmd = RemotingCommand.request(int(route.code), ext, body)
    stype = draw(st.sampled_from([SerializeType.JSON, SerializeType.ROCKETMQ]))
    flag = draw(st.sampled_from([0, 0, 0, FLAG_ONEWAY, FLAG_RESPONSE]))
    cmd = dataclasses.replace(cmd, opaque=draw(st.integers(-2**31, 2**31 - 1)), flag=flag, serialize_type=stype)
    try:
        return encode_frame(cmd)
    except ProtocolError:  # e.g. a field too long for the binary header: send it as JSON
        return encode_frame(dataclasses.replace(cmd, serialize_type=SerializeType.JSON))


malformed_streams = st.lists(frames(), min_size=1, max_size=3).map(b"".join) | st.binary(max_size=64)
request_streams = st.lists(requests_(), min_size=1, max_size=3).map(b"".join)


def _exchange(addr: str, data: bytes, expected: int, until_closed: bool) -> tuple[list[RemotingCommand], bool]:
    """Send ``data`` on a new connection; read answers until ``expected`` came (or, ``until_closed``, the broker
    closed: True), or WAIT_S passed. The broker's answers must themselves be well-formed frames."""
    host, port = addr.rsplit(":", 1)
    codec = FrameCodec()
    got: list[RemotingCommand] = []
    closed = False
    with socket.create_connection((host, int(port)), timeout=5.0) as s:
        try:
            s.sendall(data)
        except (BrokenPipeError, ConnectionResetError):
            return got, True
        deadline = time.monotonic() + WAIT_S
        while until_closed or len(got) < expected or expected == 0:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            quiet = expected == 0 and not until_closed  # nothing to wait for: a short look for a close
            s.settimeout(min(left, 0.5) if quiet else left)
            try:
                chunk = s.recv(65536)
            except TimeoutError:
                if quiet:
                    break
                continue
            except ConnectionResetError:
                closed = True
                break
            if not chunk:
                closed = True
                break
            codec.receive_data(chunk)
            while (frame := codec.next_frame()) is not NEED_DATA:
                got.append(frame)
    return got, closed


def _poke(live: tuple[Cluster, Normal], data: bytes) -> list[RemotingCommand]:
    """Send ``data`` on a connection of its own: the broker answers each request precisely (or holds a pull),
    or closes the connection when the stream is malformed; then the normal client is served."""
    cluster, normal = live
    # What the broker sees before we close (its frame limit is RocketMQ's 16 MiB).
    sent, error, _ = decode_stream(data, [], eof=False, max_frame=DEFAULT_MAX_FRAME_SIZE)
    requests = [c for c in sent if not c.flag & (FLAG_RESPONSE | FLAG_ONEWAY)]
    got, closed = _exchange(cluster.broker.addr, data, len(requests), until_closed=error is not None)
    if error is not None:
        assert closed, f"a malformed stream ({error}) left the connection open"
    wanted = [c.opaque for c in requests]
    for resp in got:
        assert resp.is_response and resp.opaque in wanted, resp
        remark = resp.remark or ""
        # The dispatcher's answer to an unexpected exception ("KeyError: ...", logged with a traceback).
        assert not (resp.code == ResponseCode.SYSTEM_ERROR and remark.split(":")[0].endswith(("Error", "Exception"))
                    and " " not in remark.split(":")[0]), remark
    if not closed:
        answered = [r.opaque for r in got]
        missing = [c for c in requests if c.opaque not in answered and c.code != RequestCode.PULL_MESSAGE]
        assert not missing, f"requests neither answered nor closed: {missing}"
    normal.send()  # the normal client, on its own connection, is served meanwhile
    assert cluster.broker.alive()
    return got


@pytest.mark.slow
@settings(deadline=None, max_examples=40, derandomize=True, suppress_health_check=list(HealthCheck))
@given(data=malformed_streams)
def test_a_live_broker_closes_malformed_streams_and_keeps_serving(live: tuple[Cluster, Normal], data: bytes) -> None:
    _poke(live, data)


@pytest.mark.slow
@settings(deadline=None, max_examples=80, derandomize=True, suppress_health_check=list(HealthCheck))
@given(data=request_streams)
def test_a_live_broker_answers_fuzzed_requests_precisely_and_keeps_serving(live: tuple[Cluster, Normal],
                                                                           data: bytes) -> None:
    _poke(live, data)


NAMESRV_CODES = [RequestCode.REGISTER_BROKER, RequestCode.UNREGISTER_BROKER, RequestCode.GET_ROUTEINFO_BY_TOPIC,
                 RequestCode.GET_BROKER_CLUSTER_INFO, RequestCode.GET_ALL_TOPIC_LIST_FROM_NAMESERVER,
                 RequestCode.DELETE_TOPIC_IN_NAMESRV, RequestCode.PUT_KV_CONFIG, RequestCode.GET_KV_CONFIG,
                 RequestCode.DELETE_KV_CONFIG, RequestCode.QUERY_DATA_VERSION]


@st.composite
def namesrv_requests(draw: st.DrawFn) -> bytes:
    """A namesrv request with fuzzed fields and body (never naming the normal client's broker or topic)."""
    ext = dict(PLAUSIBLE) if draw(st.integers(0, 3)) else {}
    ext.update(draw(ext_fields))
    ext["topic"] = draw(FUZZ_TOPICS)
    for key in ("brokerName", "clusterName", "brokerAddr"):
        ext[key] = draw(st.sampled_from(["FuzzB", "", "127.0.0.1:1", "nohost"]) | st.text(max_size=6))
    body = draw(st.binary(max_size=64) | json_values.map(lambda v: json.dumps(v).encode()))
    cmd = RemotingCommand.request(int(draw(st.sampled_from(NAMESRV_CODES))), ext, body)
    return encode_frame(dataclasses.replace(cmd, opaque=draw(st.integers(1, 2**31 - 1))))


@pytest.mark.slow
@settings(deadline=None, max_examples=60, derandomize=True, suppress_health_check=list(HealthCheck))
@given(data=st.lists(namesrv_requests(), min_size=1, max_size=3).map(b"".join) | malformed_streams)
def test_a_live_namesrv_answers_or_closes_and_keeps_routing(live: tuple[Cluster, Normal], data: bytes) -> None:
    cluster, normal = live
    sent, error, _ = decode_stream(data, [], eof=False, max_frame=DEFAULT_MAX_FRAME_SIZE)
    requests = [c for c in sent if not c.flag & (FLAG_RESPONSE | FLAG_ONEWAY)]
    got, closed = _exchange(cluster.ns, data, len(requests), until_closed=error is not None)
    if error is not None:
        assert closed
    else:
        assert sorted(r.opaque for r in got) == sorted(c.opaque for c in requests)
    for resp in got:
        head = (resp.remark or "").split(":")[0]
        assert not (resp.code == ResponseCode.SYSTEM_ERROR and head.endswith(("Error", "Exception"))
                    and " " not in head), resp.remark
    normal.send()  # routed by this namesrv
    assert cluster.namesrv.alive()


@pytest.mark.slow
def test_after_the_fuzzing_the_broker_logged_no_traceback_and_the_normal_client_reads_all(
        live: tuple[Cluster, Normal]) -> None:
    cluster, normal = live
    normal.send()
    for server in (cluster.broker, cluster.namesrv):
        err = server.stderr()
        assert "Traceback" not in err, err[-4000:]
    with PullConsumer("CG_abuse_normal", cluster.ns) as consumer:
        got: list[bytes] = []
        for mq in consumer.fetch_message_queues(TOPIC):
            offset = 0
            while True:
                r = consumer.pull(mq, "*", offset)
                if not r.msg_found_list:
                    break
                got += [m.body for m in r.msg_found_list]
                offset = r.next_begin_offset
    assert sorted(got) == sorted(normal.sent)
