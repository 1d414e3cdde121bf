"""Acceptance: RocketMQ clients nobody here wrote, against a real `sluice namesrv` and `sluice broker`.

The clients are the Apache C++ 4.x client (librocketmq 1.0.1 from the `rocketmq` 0.4.4 wheel, in
.venv-cpp) and ali-ons 3.12.0 (pure JS), installed by scripts/bootstrap_clients.sh, which the
`clients` fixture runs (it is idempotent and quick once done). Each client run is a child process
(cpp_client.py / ons_client.js) with a timeout: librocketmq SIGSEGVs on protocol errors, and a crash
must fail a test, not the session. A failing test prints every client's output, librocketmq's log
and the servers' logs (shown by pytest under "Captured stdout teardown").

Both clients re-check tags themselves, so tag tests alone would pass against a broker that does not
filter. What only the server can do is checked too: an untagged message must not reach a
`TagA || TagB` subscriber (ali-ons lets untagged messages through), and SQL92 (ali-ons) is not
re-checked by the client at all.
"""
from __future__ import annotations

import base64
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

import pytest

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
CPP_PYTHON = ROOT / ".venv-cpp" / "bin" / "python"


def _broker_command_available() -> bool:
    try:
        done = subprocess.run([sys.executable, "-m", "sluice", "broker", "--help"], cwd=ROOT,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return done.returncode == 0


pytestmark = [
    pytest.mark.integration,
    pytest.mark.slow,
    pytest.mark.skipif(not _broker_command_available(),
                       reason="`python -m sluice broker --help` fails: the broker command does not exist yet"),
]

USER_PROPS = ("a", "region", "color")
CLIENT_TIMEOUT = 40.0  # seconds for one client job; each program also enforces it itself


# --------------------------------------------------------------------------- client runs

@dataclass
class ClientRun:
    """One client program running as a child process, its JSON lines collected by a reader thread."""

    name: str
    argv: list[str]
    proc: subprocess.Popen[str]
    stderr_path: Path
    events: list[dict[str, Any]] = field(default_factory=list)
    raw: list[str] = field(default_factory=list)
    changed: threading.Condition = field(default_factory=threading.Condition)
    _reader: threading.Thread | None = None

    def __post_init__(self) -> None:
        self._reader = threading.Thread(target=self._read, name=f"read-{self.name}", daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            with self.changed:
                self.raw.append(line.rstrip("\n"))
                try:
                    obj = json.loads(line)
                except ValueError:
                    obj = None
                if isinstance(obj, dict):
                    self.events.append(obj)
                self.changed.notify_all()
        with self.changed:
            self.changed.notify_all()

    def wait_event(self, event: str, timeout: float) -> dict[str, Any]:
        """The first line with this event; fails if the program ends or the time runs out first."""
        deadline = time.monotonic() + timeout
        with self.changed:
            while True:
                for obj in self.events:
                    if obj.get("event") == event:
                        return obj
                left = deadline - time.monotonic()
                assert self._reader is not None
                if self.proc.poll() is not None and not self._reader.is_alive():
                    pytest.fail(f"{self.name} ended ({self.exit_text()}) before printing {event!r}")
                if left <= 0:
                    pytest.fail(f"{self.name} printed no {event!r} within {timeout:g} s")
                self.changed.wait(min(left, 0.2))

    def finish(self, timeout: float = CLIENT_TIMEOUT + 20) -> dict[str, Any]:
        """Wait for the exit (killing the process group on timeout); returns the summary line."""
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            pytest.fail(f"{self.name} still ran after {timeout:g} s and was killed")
        assert self._reader is not None
        self._reader.join(10)
        summaries = [e for e in self.events if e.get("event") == "summary"]
        assert summaries, f"{self.name} ended ({self.exit_text()}) without a summary line"
        return summaries[-1]

    def kill(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)  # our own child's session, by pid
            self.proc.wait(10)

    def exit_text(self) -> str:
        rc = self.proc.returncode
        if rc is None:
            return "still running"
        if rc < 0:
            return f"killed by {signal.Signals(-rc).name}"
        return f"exit status {rc}"

    def of(self, event: str) -> list[dict[str, Any]]:
        with self.changed:
            return [e for e in self.events if e.get("event") == event]

    def report(self) -> str:
        try:
            err = self.stderr_path.read_text(errors="replace")[-4000:]
        except OSError:
            err = ""
        out = "\n".join(self.raw)[-8000:]
        return (f"=== {self.name}: {' '.join(self.argv)}\n--- {self.exit_text()}; stdout ---\n{out}\n"
                f"--- stderr (tail) ---\n{err}")


class Clients:
    """Starts client programs for one test and remembers them for the failure report."""

    def __init__(self, tmp: Path, namesrv: str) -> None:
        self.tmp = tmp
        self.namesrv = namesrv
        self.runs: list[ClientRun] = []
        # librocketmq writes its logs (and offset snapshots) under $HOME.
        self.cpp_home = tmp / "cpp-home"
        self.cpp_home.mkdir(exist_ok=True)

    def _start(self, name: str, argv: list[str], env: dict[str, str]) -> ClientRun:
        stderr_path = self.tmp / f"{name}-{len(self.runs)}.stderr.log"
        with open(stderr_path, "w") as err:
            proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=err,
                                    text=True, cwd=HERE, env=env, start_new_session=True)
        run = ClientRun(name, argv, proc, stderr_path)
        self.runs.append(run)
        return run

    def cpp(self, command: str, *args: str, topic: str, group: str) -> ClientRun:
        argv = [str(CPP_PYTHON), str(HERE / "cpp_client.py"), command, "--namesrv", self.namesrv,
                "--topic", topic, "--group", group, "--timeout", str(CLIENT_TIMEOUT), *args]
        env = {**os.environ, "HOME": str(self.cpp_home), "PYTHONUNBUFFERED": "1"}
        return self._start(f"cpp-{command}", argv, env)

    def ons(self, command: str, *args: str, topic: str, group: str) -> ClientRun:
        node = shutil.which("node")
        assert node, "node is not on PATH (ali-ons needs Node.js 20)"
        argv = [node, str(HERE / "ons_client.js"), command, "--namesrv", self.namesrv,
                "--topic", topic, "--group", group, "--timeout", str(CLIENT_TIMEOUT), *args]
        return self._start(f"ons-{command}", argv, dict(os.environ))

    def send(self, kind: str, topic: str, specs: list[dict[str, Any]], *, batch: bool = False) -> list[dict[str, Any]]:
        """Send with the C++ ("cpp") or ali-ons ("ons") producer and check every result.

        The first send auto-creates the topic; waiting until the namesrv routes it lets a consumer
        started next find its queues at once instead of at its next route poll (30 s).
        """
        start = self.cpp if kind == "cpp" else self.ons
        extra = ["--batch"] if batch else []
        sender = start("send", *extra, "--messages", json.dumps(specs), topic=topic, group=f"{kind}_producer")
        summary = sender.finish()
        assert summary["ok"], f"{sender.name} failed: {summary.get('error')}"
        sent = sender.of("sent")
        assert len(sent) == (1 if batch else len(specs)), sent
        assert all(s["status"] in ("OK", "SEND_OK") for s in sent), sent
        wait_for_route(self.namesrv, topic)
        return sent

    def warm_up(self, topic: str) -> None:
        """Create the topic with one librocketmq send (auto-created through TBW102's route).

        Needed before ali-ons sends: it gives up on TOPIC_NOT_EXIST and never tries TBW102. Needed
        before a C++ push consumer starts: a new librocketmq group may begin at the queue tail, and
        with no route yet it would find the queues only 30 s later. The warm-up message's tag is
        outside every subscription used here and it has no properties, so no consumer may get it.
        """
        self.send("cpp", topic, [spec(b"warm-up", "WarmUp")])

    def kill_all(self) -> None:
        for run in self.runs:
            run.kill()

    def report(self) -> str:
        parts = []
        for run in self.runs:
            parts.append(run.report())
            # librocketmq 1.0.1 logs to $HOME/logs/rocketmq-cpp/<pid>_rocketmq-cpp.log.N
            for log in sorted((self.cpp_home / "logs" / "rocketmq-cpp").glob(f"{run.proc.pid}_*")):
                lines = log.read_text(errors="replace").splitlines()[-60:]
                parts.append(f"--- librocketmq log {log.name} (tail) ---\n" + "\n".join(lines))
        return "\n".join(parts)


# --------------------------------------------------------------------------- fixtures

@pytest.fixture(scope="session")
def clients_installed() -> None:
    """CI starts from a clean clone: the tests install the clients themselves (quick when done)."""
    done = subprocess.run(["bash", str(ROOT / "scripts" / "bootstrap_clients.sh")], cwd=ROOT,
                          capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, f"bootstrap_clients.sh failed:\n{done.stdout}\n{done.stderr}"
    assert CPP_PYTHON.exists() and (HERE / "node_modules" / "ali-ons").is_dir()


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory, clients_installed: None) -> Iterator[tuple[Any, Any]]:
    """One namesrv and one broker for the module; every test uses its own topics and groups."""
    from servers import SluiceProcess

    tmp = tmp_path_factory.mktemp("cluster")
    with SluiceProcess.start(["namesrv"], tmp, name="namesrv") as ns:
        with SluiceProcess.start(["broker", "--namesrv", ns.addr, "--store", str(tmp / "store")], tmp,
                                 name="broker") as broker:
            wait_for_registration(ns.addr)
            yield ns, broker


@pytest.fixture
def run(cluster: tuple[Any, Any], tmp_path: Path) -> Iterator[Clients]:
    ns, broker = cluster
    clients = Clients(tmp_path, ns.addr)
    try:
        yield clients
    finally:
        clients.kill_all()
        # pytest shows this only when the test failed.
        print(clients.report())
        for server in (ns, broker):
            print(f"=== {server.stderr_path.name} (tail)\n{server.stderr()[-6000:]}")


def wait_for_route(namesrv: str, topic: str, timeout: float = 20.0) -> None:
    from sluice.errors import SluiceError
    from sluice.namesrv.client import SyncNamesrvClient

    deadline = time.monotonic() + timeout
    with SyncNamesrvClient(namesrv, timeout=3.0) as client:
        while True:
            try:
                client.get_route(topic)
                return
            except SluiceError as exc:
                if time.monotonic() > deadline:
                    pytest.fail(f"namesrv has no route for {topic} {timeout:g} s after a send to it ({exc}); "
                                "the broker must register an auto-created topic with the namesrv at once")
            time.sleep(0.2)


def wait_for_registration(namesrv: str, timeout: float = 30.0) -> None:
    """Bounded wait until the broker has registered, so the first client gets a route."""
    from sluice.namesrv.client import SyncNamesrvClient

    deadline = time.monotonic() + timeout
    with SyncNamesrvClient(namesrv, timeout=3.0) as client:
        while not client.get_cluster_info().broker_addr_table:
            if time.monotonic() > deadline:
                pytest.fail(f"no broker registered with namesrv {namesrv} within {timeout:g} s")
            time.sleep(0.2)


# --------------------------------------------------------------------------- message helpers

def spec(body: bytes, tags: str | None = None, keys: tuple[str, ...] = (), **props: str) -> dict[str, Any]:
    return {"tags": tags, "keys": list(keys), "props": props, "body_b64": base64.b64encode(body).decode()}


def view(tags: str | None, keys: list[str], props: dict[str, str], body_b64: str) -> tuple[Any, ...]:
    """What must survive the trip: tag, keys, user properties, body."""
    user = tuple(sorted((k, v) for k, v in props.items() if k in USER_PROPS))
    return (tags or None, tuple(keys), user, body_b64)


def expected(specs: list[dict[str, Any]]) -> Counter[tuple[Any, ...]]:
    return Counter(view(s["tags"], s["keys"], s["props"], s["body_b64"]) for s in specs)


def received(run: ClientRun) -> Counter[tuple[Any, ...]]:
    return Counter(view(m["tags"], m["keys"], m["properties"], m["body_b64"]) for m in run.of("message"))


def assert_consumed(run: ClientRun, want: Counter[tuple[Any, ...]]) -> None:
    summary = run.finish()
    got = received(run)
    missing, extra = want - got, got - want
    assert not missing and not extra, (
        f"{run.name}: missing {sorted(missing.elements(), key=repr)}, "
        f"unexpected {sorted(extra.elements(), key=repr)}")
    assert summary["ok"], f"{run.name} failed: {summary.get('error')}"


def unique(name: str) -> str:
    """Fresh topic and group names: a consumer group left over from another run would share the queues."""
    return f"{name}_{os.getpid()}_{time.monotonic_ns() % 10**9}"


TAGGED = [
    spec(b"order-1 created", "TagA", ("k1", "order-1"), a="7", region="eu"),
    spec(b"order-2 shipped", "TagB", ("k2",), a="9", region="us"),
    spec(b"order-3 ignored", "TagC", ("k3",), a="3", region="eu"),
    spec("ünïcödé body".encode(), "TagA", (), color="blue"),
    spec(b"order-5 other", "TagC", ("k5",), a="8", region="cn"),
    spec(b"order-6 shipped", "TagB", ("k6", "order-6"), a="6", region="us"),
]
TAG_A_OR_B = [s for s in TAGGED if s["tags"] in ("TagA", "TagB")]


# --------------------------------------------------------------------------- C++ client

def test_cpp_send_then_cpp_push_with_tag_expression(run: Clients) -> None:
    topic, group = unique("CppTags"), unique("cpp_push_tags")
    run.warm_up(topic)
    consumer = run.cpp("push", "--expression", "TagA || TagB", "--expect", str(len(TAG_A_OR_B)),
                       "--props", ",".join(USER_PROPS), topic=topic, group=group)
    consumer.wait_event("ready", CLIENT_TIMEOUT)
    sent = run.send("cpp", topic, TAGGED)
    assert_consumed(consumer, expected(TAG_A_OR_B))
    # librocketmq reports the client-made UNIQ_KEY as the message id on both ends.
    want_ids = {s["msg_id"] for s, m in zip(sent, TAGGED) if m["tags"] in ("TagA", "TagB")}
    assert {m["uniq_key"] for m in consumer.of("message")} == want_ids
    assert all(m["topic"] == topic for m in consumer.of("message"))


def test_cpp_push_consumer_started_before_its_topic_exists(run: Clients) -> None:
    # RocketMQ's quickstart order with librocketmq's default CONSUME_FROM_LAST_OFFSET (issue #16): no topic, no
    # route, so the consumer meets the broker only at its next route poll (30 s), after the sends. The broker
    # starts the new group where it subscribed (its subVersion), so none of those messages is skipped.
    topic, group = unique("CppFirst"), unique("cpp_push_first")
    job = CLIENT_TIMEOUT + 45  # one route poll more than a consumer of an existing topic needs
    consumer = run.cpp("push", "--expect", str(len(TAGGED)), "--props", ",".join(USER_PROPS),
                       "--timeout", str(job), topic=topic, group=group)
    consumer.wait_event("ready", CLIENT_TIMEOUT)
    run.send("cpp", topic, TAGGED)
    consumer.finish(job + 20)
    assert_consumed(consumer, expected(TAGGED))


def test_cpp_pull_consumer_reads_everything_from_offset_zero(run: Clients) -> None:
    topic = unique("CppPull")
    run.send("cpp", topic, TAGGED)
    puller = run.cpp("pull", "--expect", str(len(TAGGED)), "--props", ",".join(USER_PROPS),
                     topic=topic, group=unique("cpp_pull_all"))
    assert_consumed(puller, expected(TAGGED))
    # Queue offsets are dense from 0 in every queue the producer spread the messages over.
    by_queue: dict[int, list[int]] = {}
    for m in puller.of("message"):
        by_queue.setdefault(m["queue_id"], []).append(m["queue_offset"])
    assert all(sorted(offs) == list(range(len(offs))) for offs in by_queue.values()), by_queue
    summary = puller.of("summary")[-1]
    assert sum(q["next_offset"] for q in summary["queues"]) == len(TAGGED)


def test_cpp_batch_is_stored_as_separate_messages(run: Clients) -> None:
    # librocketmq 1.0.1 sends a batch as SEND_MESSAGE (10) with batch=1; the broker must split it.
    topic = unique("CppBatch")
    batch = [spec(f"batch-{i}".encode(), "TagA", (f"bk{i}",), a=str(i)) for i in range(5)]
    run.send("cpp", topic, batch, batch=True)
    puller = run.cpp("pull", "--expect", str(len(batch)), "--props", ",".join(USER_PROPS),
                     topic=topic, group=unique("cpp_pull_batch"))
    puller.finish()
    stored = len(puller.of("message"))
    assert stored == len(batch), (
        f"a batch of {len(batch)} came back as {stored} message(s): librocketmq 1.0.1 sends it as "
        "SEND_MESSAGE (10) with extFields batch='1' (not 'true') and the body in batch encoding")
    assert_consumed(puller, expected(batch))


# --------------------------------------------------------------------------- ali-ons

def test_ons_send_then_ons_push_with_tag_expression(run: Clients) -> None:
    topic = unique("OnsTags")
    # ali-ons passes untagged messages through its own tag check: only the broker can drop this one.
    untagged = spec(b"no tag at all", None, ("k0",), a="10", region="eu")
    specs = TAGGED + [untagged]
    run.warm_up(topic)
    sent = run.send("ons", topic, specs)
    consumer = run.ons("push", "--expression", "TagA || TagB", "--expect", str(len(TAG_A_OR_B)),
                       topic=topic, group=unique("ons_push_tags"))
    assert_consumed(consumer, expected(TAG_A_OR_B))
    # The broker's msgId (store host + commit-log offset) must match the record it serves back.
    want_ids = {s["msg_id"] for s, m in zip(sent, specs) if m["tags"] in ("TagA", "TagB")}
    assert {m["msg_id"] for m in consumer.of("message")} == want_ids


def test_ons_push_with_sql92_expression_is_filtered_by_the_server(run: Clients) -> None:
    topic = unique("OnsSql")
    specs = [
        spec(b"match eu", "TagA", (), a="7", region="eu"),
        spec(b"match us, any tag", "TagC", (), a="6", region="us"),
        spec(b"a not > 5", "TagA", (), a="5", region="eu"),
        spec(b"wrong region", "TagB", (), a="8", region="cn"),
        spec(b"no a at all", "TagA", (), region="eu"),
        spec(b"no properties", None, ()),
        spec(b"match big a", None, ("big",), a="1000", region="us"),
    ]
    sql = "a > 5 AND region IN ('eu', 'us')"
    want = [s for s in specs if s["body_b64"] in {spec(b, None)["body_b64"]
                                                 for b in (b"match eu", b"match us, any tag", b"match big a")}]
    run.warm_up(topic)
    run.send("ons", topic, specs)
    consumer = run.ons("push", "--sql", sql, "--expect", str(len(want)), topic=topic, group=unique("ons_push_sql"))
    assert_consumed(consumer, expected(want))


# --------------------------------------------------------------------------- mixed

def test_cpp_sends_ons_consumes(run: Clients) -> None:
    topic = unique("CppToOns")
    # A body with NUL and high bytes: librocketmq sends it by length, ali-ons reads it by length.
    specs = TAGGED + [spec(b"\x00\x01binary\xff\x00", "TagB", ("bin",), a="11")]
    sent = run.send("cpp", topic, specs)
    consumer = run.ons("push", "--expression", "*", "--expect", str(len(specs)), topic=topic, group=unique("ons_from_cpp"))
    assert_consumed(consumer, expected(specs))
    assert {m["uniq_key"] for m in consumer.of("message")} == {s["msg_id"] for s in sent}


def test_ons_sends_cpp_consumes(run: Clients) -> None:
    topic = unique("OnsToCpp")
    run.warm_up(topic)
    consumer = run.cpp("push", "--expression", "TagA || TagB", "--expect", str(len(TAG_A_OR_B)),
                       "--props", ",".join(USER_PROPS), topic=topic, group=unique("cpp_from_ons"))
    consumer.wait_event("ready", CLIENT_TIMEOUT)
    run.send("ons", topic, TAGGED)
    assert_consumed(consumer, expected(TAG_A_OR_B))


def test_ons_consumer_restart_resumes_from_its_committed_offsets(run: Clients) -> None:
    # ali-ons commits offsets (oneway UPDATE_CONSUMER_OFFSET) as it goes and at close; a restarted
    # consumer of the same group asks QUERY_CONSUMER_OFFSET and must get only what is new.
    topic, group = unique("OnsResume"), unique("ons_resume")
    first = [spec(f"first-{i}".encode(), "TagA", (f"f{i}",), a=str(i)) for i in range(3)]
    second = [spec(f"second-{i}".encode(), "TagA", (f"s{i}",), a=str(i)) for i in range(2)]
    run.warm_up(topic)
    run.send("ons", topic, first)
    assert_consumed(run.ons("push", "--expression", "TagA", "--expect", str(len(first)), topic=topic, group=group),
                    expected(first))
    run.send("ons", topic, second)
    assert_consumed(run.ons("push", "--expression", "TagA", "--expect", str(len(second)), topic=topic, group=group),
                    expected(second))
