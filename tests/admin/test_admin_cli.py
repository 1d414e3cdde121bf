"""``sluice admin`` in-process without servers: parsing, usage errors, exit statuses, output helpers, codecs."""
from __future__ import annotations

import datetime as dt
import io
import subprocess
import sys

import click
import pytest
from admin_support import run_admin
from hypothesis import given
from hypothesis import strategies as st
from servers import free_port

from sluice import errors as E
from sluice.admin import ExitStatus, admin_group, exit_status_for
from sluice.admin.core import load_families
from sluice.admin.deadletters import origin_topic, resend_properties
from sluice.admin.output import Result, fmt_time, message_role, render, table
from sluice.admin.params import parse_timestamp
from sluice.message import MessageExt
from sluice.protocol import properties as P
from sluice.protocol.bodies import MessageQueue
from sluice.protocol.offset_table import decode_offset_table, decode_queue_table, encode_fastjson_offset_table

MQADMIN_NAMES = ["updateTopic", "topicList", "topicRoute", "topicStatus", "clusterList", "brokerStatus",
                 "consumerProgress", "consumerConnection", "queryMsgByKey", "queryMsgById", "queryMsgByUniqueKey",
                 "resetOffsetByTime", "sendMessage", "consumeMessage"]


def test_every_mqadmin_name_and_its_kebab_alias_is_a_command() -> None:
    load_families()
    for name in MQADMIN_NAMES + ["resendDeadLetters", "deleteTopic"]:
        assert name in admin_group.commands, name
        kebab = "".join("-" + c.lower() if c.isupper() else c for c in name)
        assert admin_group.aliases.get(kebab) == name, kebab
    assert admin_group.aliases["dlqResend"] == "resendDeadLetters"


@pytest.mark.parametrize("argv", [["topicList", "-h"], ["topic-list", "--help"], ["--help"]])
def test_help_exits_zero_on_stdout(argv: list[str]) -> None:
    r = run_admin(*argv)
    assert r.status is ExitStatus.SUCCESS
    assert "Usage: sluice admin" in r.stdout and r.stderr == ""


def test_help_lists_commands_once() -> None:
    r = run_admin("--help")
    assert r.stdout.count("queryMsgByKey ") == 1
    assert "query-msg-by-key" not in r.stdout


def test_no_arguments_prints_help_with_usage_status() -> None:
    r = run_admin()
    assert r.status is ExitStatus.USAGE and "Commands:" in r.stdout


def test_unknown_command_and_option_are_usage_errors() -> None:
    r = run_admin("topicLst", "-n", "127.0.0.1:1")
    assert r.status is ExitStatus.USAGE and "No such command 'topicLst'" in r.stderr
    r = run_admin("topicList", "--bogus", "-n", "127.0.0.1:1")
    assert r.status is ExitStatus.USAGE and "--bogus" in r.stderr


def test_missing_required_option_is_a_usage_error() -> None:
    r = run_admin("topicRoute", "-n", "127.0.0.1:1")
    assert r.status is ExitStatus.USAGE
    assert "Missing option '-t'" in r.stderr and "Try 'sluice admin topicRoute -h'" in r.stderr


def test_no_namesrv_address_says_where_it_comes_from() -> None:
    r = run_admin("topicList")
    assert r.status is ExitStatus.USAGE
    assert "-n/--namesrv" in r.stderr and "SLUICE_NAMESRV" in r.stderr


def test_unreachable_namesrv_is_unavailable_for_each_env_var_and_flag_position() -> None:
    addr = f"127.0.0.1:{free_port()}"  # nothing listens there
    for argv, env in ((["topicList", "-n", addr], {}), (["-n", addr, "topicList"], {}),
                      (["topicList"], {"SLUICE_NAMESRV": addr}), (["topicList"], {"NAMESRV_ADDR": addr})):
        r = run_admin(*argv, env=env)
        assert r.status is ExitStatus.UNAVAILABLE, (argv, env, r.stderr)
        assert addr in r.stderr and r.stdout == ""


def test_flag_overrides_environment() -> None:
    dead = f"127.0.0.1:{free_port()}"
    r = run_admin("topicList", "-n", dead, env={"SLUICE_NAMESRV": "127.0.0.1:1"})
    assert dead in r.stderr


def test_json_errors_are_json_on_stderr() -> None:
    addr = f"127.0.0.1:{free_port()}"
    r = run_admin("clusterList", "--json", "-n", addr)
    assert r.status is ExitStatus.UNAVAILABLE and r.stdout == ""
    assert r.error["status"] == "UNAVAILABLE" and r.error["exitStatus"] == 4 and r.error["type"] == "RemotingError"
    r = run_admin("--json", "updateTopic", "-t", "T", "-n", addr)
    assert r.status is ExitStatus.USAGE and "exactly one of -c/--clusterName and -b/--brokerAddr" in r.error["message"]


@pytest.mark.parametrize("argv, message", [
    (["updateTopic", "-t", "T", "-c", "C", "-b", "127.0.0.1:1"], "exactly one of"),
    (["updateTopic", "-t", "T", "-c", "C", "-p", "5"], "'5' is not one of"),
    (["updateTopic", "-t", "T", "-c", "C", "-r", "0"], "0 is not in the range"),
    (["resetOffsetByTime", "-g", "G", "-t", "T"], "exactly one of -s/--timestamp and -o/--offset"),
    (["resetOffsetByTime", "-g", "G", "-t", "T", "-o", "5"], "-o/--offset needs -q/--queue"),
    (["resetOffsetByTime", "-g", "G", "-t", "T", "-s", "yesterday"], "is not a timestamp"),
    (["sendMessage", "-t", "T"], "exactly one of -p/--body and --body-file"),
    (["sendMessage", "-t", "T", "-p", "x", "-b", "broker-a"], "-b/--broker and -i/--qid go together"),
    (["sendMessage", "-t", "T", "-p", "x", "-P", "novalue"], "is not name=value"),
    (["consumeMessage", "-t", "T", "--tags", "A", "--sql", "a > 1"], "exclude each other"),
    (["consumeMessage", "-t", "T", "-o", "3"], "-o/--offset needs -i/--queueId"),
    (["consumerProgress", "-t", "T"], "-t/--topic needs -g/--groupName"),
    (["brokerStatus"], "exactly one of -b/--brokerAddr and -c/--clusterName"),
])
def test_bad_combinations_are_usage_errors_before_any_request(argv: list[str], message: str) -> None:
    # The namesrv does not exist: a usage error must be found without asking it.
    r = run_admin(*argv, "-n", f"127.0.0.1:{free_port()}")
    assert r.status is ExitStatus.USAGE, r.stderr
    assert message in r.stderr


def test_bad_topic_name_is_refused() -> None:
    r = run_admin("updateTopic", "-t", "bad topic!", "-b", "127.0.0.1:1", "-n", f"127.0.0.1:{free_port()}")
    assert r.status is ExitStatus.REFUSED and "bad topic!" in r.stderr


def test_bad_sql_selector_is_refused_with_its_position() -> None:
    addr = f"127.0.0.1:{free_port()}"
    r = run_admin("consumeMessage", "-t", "T", "--sql", "a >", "-n", addr)
    assert r.status is ExitStatus.REFUSED, r.stderr


# ------------------------------------------------------------------------------------------ exit statuses

@pytest.mark.parametrize("exc, status", [
    (E.NotFoundError("x"), ExitStatus.NOT_FOUND),
    (E.TopicNotExistError("x"), ExitStatus.NOT_FOUND),
    (E.BrokerResponseError("not online", code=206), ExitStatus.NOT_FOUND),
    (E.BrokerResponseError("nope", code=22), ExitStatus.NOT_FOUND),
    (E.RemotingTimeoutError("slow"), ExitStatus.UNAVAILABLE),
    (E.ServiceNotAvailableError("stopping"), ExitStatus.UNAVAILABLE),
    (E.NoPermissionError("ro"), ExitStatus.REFUSED),
    (E.MessageIllegalError("big"), ExitStatus.REFUSED),
    (E.SelectorSyntaxError("bad", position=3), ExitStatus.REFUSED),
    (E.InvalidParameterError("bad"), ExitStatus.REFUSED),
    (E.SluiceError("boom"), ExitStatus.ERROR),
    (E.ClientError("boom"), ExitStatus.ERROR),
    (ValueError("bug"), ExitStatus.ERROR),
    (KeyboardInterrupt(), ExitStatus.INTERRUPTED),
    (click.UsageError("u"), ExitStatus.USAGE),
])
def test_exit_status_mapping(exc: BaseException, status: ExitStatus) -> None:
    assert exit_status_for(exc) is status


def test_sluice_admin_subprocess_exit_status() -> None:
    """The real `sluice admin` entry point exits with main()'s status."""
    proc = subprocess.run([sys.executable, "-m", "sluice", "admin", "topicList", "-n", f"127.0.0.1:{free_port()}"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == ExitStatus.UNAVAILABLE, proc.stderr
    assert proc.stderr.startswith("error: no namesrv answered")
    proc = subprocess.run([sys.executable, "-m", "sluice", "admin", "topic-route", "-h"], capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 0 and "Usage: sluice admin topicRoute" in proc.stdout


# ------------------------------------------------------------------------------------------ parameters / output

def test_parse_timestamp_forms() -> None:
    assert parse_timestamp("1706708700000") == 1706708700000
    assert parse_timestamp("now", now=12.5) == 12500
    local = int(dt.datetime(2024, 1, 31, 13, 45, 0, 123000).timestamp() * 1000)
    assert parse_timestamp("2024-01-31#13:45:00:123") == local
    assert parse_timestamp("2024-01-31T13:45:00.123") == local
    assert parse_timestamp("2024-01-31T13:45:00+00:00") == 1706708700000
    assert parse_timestamp("earliest", words=True) == 0 and parse_timestamp("latest", words=True) == -1
    assert parse_timestamp("-1", words=True) == -1
    for bad in ("latest", "-5", "2024-13-01#00:00:00", "soon"):
        with pytest.raises(ValueError):
            parse_timestamp(bad)


def test_render_json_and_tables_and_warnings() -> None:
    out, err = io.StringIO(), io.StringIO()
    res = Result({"a": [1, 2]}, [table("T", ["Name", "N"], [("x", 1)], right=["N"])], ["a note"], ["careful"])
    render(res, out, err, {}, as_json=True)
    assert out.getvalue() == '{\n  "a": [\n    1,\n    2\n  ]\n}\n' and err.getvalue() == "warning: careful\n"
    out, err = io.StringIO(), io.StringIO()
    render(res, out, err, {}, as_json=False)
    text = out.getvalue()
    assert "Name" in text and "x" in text and "a note" in text and "\x1b[" not in text  # no colours in a file


def test_fmt_time_and_roles() -> None:
    assert fmt_time(0) == "" and fmt_time(-1) == ""
    assert fmt_time(1706708700123).endswith(".123")
    assert [message_role(t) for t in ("Orders", "%RETRY%g", "%DLQ%g")] == ["original", "retry", "dead-letter"]


# ------------------------------------------------------------------------------------------ offset tables

def test_offset_table_fastjson_form_round_trips() -> None:
    table_ = {MessageQueue(topic="T", broker_name="broker-a", queue_id=1): 42,
              MessageQueue(topic="T", broker_name="broker-b", queue_id=0): 0}
    raw = encode_fastjson_offset_table(table_)
    assert raw.startswith(b'{"offsetTable":{{"brokerName":"broker-a","queueId":1,"topic":"T"}:42,')
    assert decode_offset_table(raw) == table_


def test_offset_table_list_form_and_errors() -> None:
    raw = b'{"offsetTable":[{"topic":"T","brokerName":"b","queueId":2,"offset":7,"previousOffset":3}]}'
    assert decode_offset_table(raw) == {MessageQueue(topic="T", broker_name="b", queue_id=2): 7}
    for bad in (b"", b"[]", b'{"offsetTable":[{"topic":"T"}]}', b'{"offsetTable":{{"x":1}:2}}', b"{not json"):
        with pytest.raises(E.InvalidParameterError):
            decode_offset_table(bad)


@given(st.dictionaries(
    st.builds(lambda t, b, q: MessageQueue(topic=t, broker_name=b, queue_id=q),
              st.from_regex(r"[%|A-Za-z0-9_-]{1,20}", fullmatch=True),
              st.from_regex(r"[A-Za-z0-9_.:-]{1,20}", fullmatch=True), st.integers(0, 1023)),
    st.integers(0, 2**63 - 1), max_size=20))
def test_offset_table_property(table_: dict[MessageQueue, int]) -> None:
    assert decode_offset_table(encode_fastjson_offset_table(table_)) == table_


# ------------------------------------------------------------------------------------------ dead letters

def _ext(props: dict[str, str], topic: str = "%DLQ%g") -> MessageExt:
    return MessageExt(topic=topic, body=b"x", properties=props, queue_id=0, queue_offset=0, commitlog_offset=0,
                      msg_id=props.get(P.UNIQ_KEY, ""), offset_msg_id="", sysflag=0, flag=0, born_timestamp=0,
                      born_host=("127.0.0.1", 1), store_timestamp=0, store_host=("127.0.0.1", 2), reconsume_times=17,
                      body_crc=0, store_size=0)


def test_origin_topic_precedence() -> None:
    assert origin_topic(_ext({P.DLQ_ORIGIN_TOPIC: "A", P.RETRY_TOPIC: "B", P.REAL_TOPIC: "C"})) == "A"
    assert origin_topic(_ext({P.RETRY_TOPIC: "B", P.REAL_TOPIC: "C"})) == "B"
    assert origin_topic(_ext({P.REAL_TOPIC: "C"})) == "C"
    assert origin_topic(_ext({P.RETRY_TOPIC: "%RETRY%g"})) is None
    assert origin_topic(_ext({})) is None


def test_resend_properties_keep_the_message_and_drop_the_retry_path() -> None:
    props = {P.UNIQ_KEY: "U1", P.TAGS: "TagA", P.KEYS: "k1 k2", "region": "eu", P.RETRY_TOPIC: "Orders",
             P.DLQ_ORIGIN_TOPIC: "Orders", P.RECONSUME_TIME: "17", P.MAX_OFFSET: "9", P.DELAY: "3",
             P.ORIGIN_MESSAGE_ID: "U1", P.REAL_QID: "0"}
    kept = resend_properties(_ext(props), new_id=False)
    assert kept == {P.UNIQ_KEY: "U1", P.TAGS: "TagA", P.KEYS: "k1 k2", "region": "eu"}
    fresh = resend_properties(_ext(props), new_id=True)
    assert fresh[P.UNIQ_KEY] != "U1" and len(fresh[P.UNIQ_KEY]) == 32


def test_queue_tables_in_rocketmq_fastjson_form() -> None:
    """GET_TOPIC_STATS_INFO and GET_CONSUME_STATS bodies as a RocketMQ broker writes them (MessageQueue keys)."""
    stats = (b'{"offsetTable":{{"brokerName":"broker-a","queueId":0,"topic":"T"}:{"lastUpdateTimestamp":1706708700000,'
             b'"maxOffset":12,"minOffset":2},{"brokerName":"broker-a","queueId":1,"topic":"T"}:{"lastUpdateTimestamp":0,'
             b'"maxOffset":0,"minOffset":0}}}')
    doc, entries = decode_queue_table(stats)
    assert sorted((e["queueId"], e["minOffset"], e["maxOffset"]) for e in entries) == [(0, 2, 12), (1, 0, 0)]
    consume = (b'{"consumeTps":1.5,"offsetTable":{{"brokerName":"b","queueId":3,"topic":"T"}:'
               b'{"brokerOffset":10,"consumerOffset":4,"lastTimestamp":0}}}')
    doc, entries = decode_queue_table(consume)
    assert doc["consumeTps"] == 1.5
    assert entries == [{"brokerOffset": 10, "consumerOffset": 4, "lastTimestamp": 0, "topic": "T", "brokerName": "b",
                        "queueId": 3}]


def test_traceback_flag_prints_the_traceback() -> None:
    r = run_admin("topicList", "--traceback", "-n", f"127.0.0.1:{free_port()}")
    assert r.status is ExitStatus.UNAVAILABLE and "Traceback (most recent call last)" in r.stderr


@given(st.datetimes(min_value=dt.datetime(1971, 1, 2), max_value=dt.datetime(2200, 1, 1)))
def test_timestamp_forms_agree(when: dt.datetime) -> None:
    when = when.replace(microsecond=when.microsecond // 1000 * 1000)
    mq = when.strftime("%Y-%m-%d#%H:%M:%S:") + f"{when.microsecond // 1000:03d}"
    ms = parse_timestamp(mq)
    assert parse_timestamp(when.isoformat()) == ms
    assert parse_timestamp(str(ms)) == ms
