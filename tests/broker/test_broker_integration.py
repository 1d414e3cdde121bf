"""`sluice namesrv` + `sluice broker` as real subprocesses: registration, round trips, restarts, flags."""
from __future__ import annotations

import signal
import time
from pathlib import Path

import pytest

from broker_support import Rpc, bodies
from servers import SluiceProcess
from sluice.errors import TopicNotExistError
from sluice.namesrv.client import SyncNamesrvClient
from sluice.protocol.codes import RequestCode, ResponseCode

pytestmark = [pytest.mark.integration, pytest.mark.slow]
R = ResponseCode


def _wait(pred, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while True:
        value = pred()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}")
        time.sleep(0.05)


def _route_or_none(ns: SyncNamesrvClient, topic: str):
    try:
        return ns.get_route(topic)
    except TopicNotExistError:
        return None


@pytest.fixture
def namesrv(tmp_path: Path):
    with SluiceProcess.start(["namesrv"], tmp_path, name="namesrv") as proc:
        yield proc


def _broker(namesrv, tmp_path: Path, *extra: str, name: str = "broker") -> SluiceProcess:
    return SluiceProcess.start(["broker", "--namesrv", namesrv.addr, "--store", str(tmp_path / "store"),
                                "--broker-name", "b1", "--cluster-name", "c1", *extra], tmp_path, name=name)


def _pull_settled(rpc: Rpc, topic: str, expected: int, timeout: float = 5.0):
    def attempt():
        resp = rpc.pull(topic)
        return resp if resp.code == R.SUCCESS and len(bodies(resp)) >= expected else None
    return _wait(attempt, timeout, f"{expected} messages in {topic}")


def test_register_send_pull_restart_unregister(namesrv, tmp_path):
    ns = SyncNamesrvClient(namesrv.addr)
    broker = _broker(namesrv, tmp_path)
    try:
        info = _wait(lambda: ns.get_cluster_info().broker_addr_table.get("b1"), 10, "registration")
        assert info.broker_addrs[0] == broker.addr
        assert _route_or_none(ns, "TBW102") is not None
        rpc = Rpc(broker.addr)
        for i in range(3):
            assert rpc.send("Integ", f"m{i}".encode(), keys=f"k{i}").code == R.SUCCESS
        # An auto-created topic is registered at once, not at the next 30 s period.
        route = _wait(lambda: _route_or_none(ns, "Integ"), 5, "route of the new topic")
        assert route.broker_datas[0].broker_addrs[0] == broker.addr
        assert bodies(_pull_settled(rpc, "Integ", 3)) == [b"m0", b"m1", b"m2"]
        rpc.oneway(RequestCode.UPDATE_CONSUMER_OFFSET,
                   dict(consumerGroup="ig", topic="Integ", queueId=0, commitOffset=2))
        _wait(lambda: rpc.call(RequestCode.QUERY_CONSUMER_OFFSET,
                               dict(consumerGroup="ig", topic="Integ", queueId=0)).code == R.SUCCESS, 5, "commit")
        rpc.close()
        assert broker.stop() == 0  # SIGTERM: graceful
        assert "stopped" in broker.stderr()
        _wait(lambda: not ns.get_cluster_info().broker_addr_table, 5, "unregistration")

        broker = _broker(namesrv, tmp_path, name="broker2")
        rpc = Rpc(broker.addr)
        assert bodies(_pull_settled(rpc, "Integ", 3)) == [b"m0", b"m1", b"m2"]
        resp = rpc.call(RequestCode.QUERY_CONSUMER_OFFSET, dict(consumerGroup="ig", topic="Integ", queueId=0))
        assert resp.code == R.SUCCESS and resp.ext_fields["offset"] == "2"
        assert rpc.call(9999).code == R.REQUEST_CODE_NOT_SUPPORTED
        rpc.close()
    finally:
        broker.stop()
        ns.close()


def test_no_auto_create_flag_and_config_file(namesrv, tmp_path):
    cfg = tmp_path / "broker.toml"
    cfg.write_text('broker_name = "from-file"\nauto_create_topic = true\nflush = "sync"\n')
    broker = _broker(namesrv, tmp_path, "--config", str(cfg), "--no-auto-create-topic")
    try:
        rpc = Rpc(broker.addr)
        resp = rpc.send("Unknown", b"x")
        assert resp.code == R.TOPIC_NOT_EXIST
        assert rpc.call(RequestCode.UPDATE_AND_CREATE_TOPIC,
                        dict(topic="Known", readQueueNums=1, writeQueueNums=1, perm=6)).code == R.SUCCESS
        assert rpc.send("Known", b"x").code == R.SUCCESS
        info = rpc.call(RequestCode.GET_BROKER_RUNTIME_INFO)
        assert b'"brokerName":"b1"' in info.body  # the flag beat the file
        assert b'"flush_mode":"sync"' in info.body  # the file's setting was taken
        rpc.close()
    finally:
        broker.stop()


def test_a_broker_without_namesrv_warns_that_clients_will_not_find_it(tmp_path):
    # A newcomer who forgets --namesrv got a broker that looked healthy and that no client could find.
    broker = SluiceProcess.start(["broker", "--store", str(tmp_path / "store")], tmp_path, name="lonely")
    try:
        err = broker.wait_for_stderr("listening on")
        assert "no namesrv given" in err and "will not find it" in err
    finally:
        broker.stop()


def test_bad_flags_exit_with_usage_error(tmp_path):
    import subprocess
    import sys
    done = subprocess.run([sys.executable, "-m", "sluice", "broker", "--listen", "nonsense", "--store",
                           str(tmp_path / "s")], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "listen address" in done.stderr


def test_sigint_also_stops_gracefully(namesrv, tmp_path):
    broker = _broker(namesrv, tmp_path)
    broker.signal(signal.SIGINT)
    assert broker.proc.wait(20) == 0
    assert "stopped" in broker.stderr()
