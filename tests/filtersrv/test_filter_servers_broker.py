"""The broker's side of filter servers: REGISTER_FILTER_SERVER (301), expiry of silent or disconnected ones,
their addresses in the route's filterServerTable, and ``filter_server_nums`` children kept running."""
from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest
from filtersrv_support import FsRpc, numbers, route_filter_servers, start_filtersrv, wait_listed, write_repository
from servers import running_cluster, wait_for

from sluice.protocol.codes import RequestCode, ResponseCode
from sluice.transport.blocking import SyncRemotingClient
from sluice.protocol.command import RemotingCommand


def _register(client: SyncRemotingClient, broker: str, addr: str) -> RemotingCommand:
    return client.invoke(broker, RemotingCommand.request(RequestCode.REGISTER_FILTER_SERVER,
                                                         {"filterServerAddr": addr}), 5.0)


def test_301_records_the_filter_server_and_answers_the_broker(make_broker) -> None:
    b = make_broker(broker_name="broker-x")
    client = SyncRemotingClient()
    try:
        resp = _register(client, b.addr, "127.0.0.1:40001")
        assert resp.code == ResponseCode.SUCCESS
        assert resp.ext_fields["brokerName"] == "broker-x" and resp.ext_fields["brokerId"] == "0"
        assert b.broker.filter_servers.addresses() == ["127.0.0.1:40001"]
        info = b.broker.runtime_info()  # what `sluice admin brokerStatus` shows
        assert info["filterServers"] == "127.0.0.1:40001" and info["filterServerRestarts"] == 0
        bad = _register(client, b.addr, "no-port")
        assert bad.code == ResponseCode.INVALID_PARAMETER and "filterServerAddr" in bad.remark
    finally:
        client.close()
    # its connection closed: dropped at once
    wait_for(lambda: b.broker.filter_servers.addresses() == [], 10, "the filter server dropped")


def test_a_silent_filter_server_expires_and_a_registering_one_stays(make_broker) -> None:
    b = make_broker()
    client = SyncRemotingClient()
    try:
        assert _register(client, b.addr, "127.0.0.1:40002").code == ResponseCode.SUCCESS
        fsm = b.broker.filter_servers

        async def expire(after: float) -> list[str]:
            return fsm.expire(time.monotonic() + after)
        assert b.loop.run(expire(20.0)) == []
        assert fsm.addresses() == ["127.0.0.1:40002"]
        assert b.loop.run(expire(31.0)) == ["127.0.0.1:40002"]
        assert fsm.addresses() == []
        assert _register(client, b.addr, "127.0.0.1:40002").code == ResponseCode.SUCCESS  # back again
        assert fsm.addresses() == ["127.0.0.1:40002"]
    finally:
        client.close()


@pytest.mark.slow
def test_routes_list_a_filter_server_while_it_runs(tmp_path: Path) -> None:
    repo = write_repository(tmp_path / "repo")
    with running_cluster(tmp_path) as c:
        fs = start_filtersrv(tmp_path, c.broker.addr, "--repository", str(repo))
        try:
            assert wait_listed(c.ns, "TBW102", c.broker.addr, fs.addr) == [fs.addr]
        finally:
            fs.stop()
        wait_for(lambda: route_filter_servers(c.ns, "TBW102", c.broker.addr) == [], 20,
                 "the stopped filter server gone from the route")


def _children(pid: int) -> dict[int, str]:
    """pid -> command line of the `sluice filtersrv` children of ``pid``."""
    out = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
            cmd = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        ppid = int(stat.rpartition(")")[2].split()[1])
        if ppid == pid and " filtersrv " in cmd:
            out[int(entry)] = cmd
    return out


@pytest.mark.slow
def test_the_broker_runs_filter_servers_restarts_a_dead_one_and_takes_them_down(tmp_path: Path) -> None:
    repo = write_repository(tmp_path / "repo")
    conf = f'filter_server_nums = 2\nfilter_class_repository = "{repo}"\n'
    with running_cluster(tmp_path, config=conf) as c:
        broker = c.broker.addr
        listed = wait_for(lambda: len(lst := route_filter_servers(c.ns, "TBW102", broker)) == 2 and lst, 30,
                          "two filter servers in the route")
        kids = _children(c.broker.pid)
        assert len(kids) == 2 and all("--repository" in cmd for cmd in kids.values())
        rpc = FsRpc(broker)
        try:
            for n in range(6):
                rpc.send("FsChildren", n)
            fs = listed[0]
            assert rpc.register(fs, "G-kids", "FsChildren", "evens:Even").code == ResponseCode.SUCCESS
            assert numbers(rpc.drain(fs, "G-kids", "FsChildren")) == [0, 2, 4]
            victim = next(pid for pid, cmd in kids.items() if f"--listen {fs} " in cmd)
            os.kill(victim, signal.SIGKILL)
            # restarted on the same address; the consumer registers again (the new process has no classes)
            wait_for(lambda: len(_children(c.broker.pid)) == 2 and victim not in _children(c.broker.pid), 30,
                     "the killed filter server restarted")
            wait_listed(c.ns, "TBW102", broker, fs, timeout=30)

            def resumed() -> bool:
                try:
                    return rpc.register(fs, "G-kids", "FsChildren", "evens:Even").code == ResponseCode.SUCCESS
                except Exception:
                    return False
            wait_for(resumed, 30, "registration with the restarted filter server")
            for n in range(6, 9):
                rpc.send("FsChildren", n)
            assert numbers(rpc.drain(fs, "G-kids", "FsChildren")) == [0, 2, 4, 6, 8]
        finally:
            rpc.close()
        kids = _children(c.broker.pid)
        c.broker.kill()  # SIGKILL: the children notice their parent is gone and stop
        wait_for(lambda: not any(_is_filtersrv(p) for p in kids), 20, "the children of a killed broker gone")


def _is_filtersrv(pid: int) -> bool:
    try:
        return b"filtersrv" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False


@pytest.mark.slow
def test_a_filter_server_registers_again_as_soon_as_its_broker_restarts(tmp_path: Path) -> None:
    repo = write_repository(tmp_path / "repo")
    with running_cluster(tmp_path) as c:
        # a 10-minute interval: only the reconnection can bring it back into the route in time
        fs = start_filtersrv(tmp_path, c.broker.addr, "--repository", str(repo), "--register-interval", "600")
        try:
            wait_listed(c.ns, "TBW102", c.broker.addr, fs.addr)
            restarted = c.restart_broker()
            restarted.wait_for_stderr(f"filter server {fs.addr} registered", timeout=30)
            wait_listed(c.ns, "TBW102", c.broker.addr, fs.addr, timeout=30)
            rpc = FsRpc(c.broker.addr)
            try:
                rpc.send("FsAfterRestart", 2)
                assert rpc.register(fs.addr, "G-r", "FsAfterRestart", "evens:Even").code == ResponseCode.SUCCESS
                assert numbers(rpc.drain(fs.addr, "G-r", "FsAfterRestart")) == [2]
            finally:
                rpc.close()
        finally:
            fs.stop()


ACL = """\
accounts:
  - accessKey: fsuser
    secretKey: user-secret-1
    admin: false
    defaultTopicPerm: PUB|SUB
    defaultGroupPerm: SUB
  - accessKey: fsadmin
    secretKey: admin-secret-1
    admin: true
"""


@pytest.mark.slow
def test_under_acl_the_children_sign_as_the_broker_and_check_consumers(tmp_path: Path) -> None:
    from sluice.acl.signature import Credentials
    repo = write_repository(tmp_path / "repo")
    (tmp_path / "plain_acl.yml").write_text(ACL)
    conf = (f'filter_server_nums = 1\nfilter_class_repository = "{repo}"\nacl = "{tmp_path / "plain_acl.yml"}"\n'
            'acl_access_key = "fsadmin"\nacl_secret_key = "admin-secret-1"\n')
    with running_cluster(tmp_path, config=conf) as c:
        broker = c.broker.addr
        fs = wait_for(lambda: (lst := route_filter_servers(c.ns, "TBW102", broker)) and lst[0], 30,
                      "the child registered (301 needs admin: it signed as the broker's account)")
        user, anonymous = FsRpc(broker, Credentials("fsuser", "user-secret-1")), FsRpc(broker)
        try:
            for n in range(4):
                user.send("FsAcl", n)
            refused = anonymous.register(fs, "G-acl", "FsAcl", "evens:Even")
            assert refused.code == ResponseCode.NO_PERMISSION and "no AccessKey" in refused.remark
            assert user.register(fs, "G-acl", "FsAcl", "evens:Even").code == ResponseCode.SUCCESS
            assert anonymous.pull(fs, "G-acl", "FsAcl", 0).code == ResponseCode.NO_PERMISSION
            assert numbers(user.drain(fs, "G-acl", "FsAcl")) == [0, 2]  # forwarded pulls signed by the child
        finally:
            user.close()
            anonymous.close()


@pytest.mark.parametrize("settings, says", [
    ({"filter_server_nums": -1}, "must not be negative"),
    ({"filter_batch_deadline_ms": 0}, "must be positive"),
])
def test_bad_filter_server_settings_are_refused(settings: dict, says: str) -> None:
    from sluice.broker.config import BrokerConfig
    from sluice.errors import InvalidParameterError
    with pytest.raises(InvalidParameterError, match=says):
        BrokerConfig.load(None, **settings).validate()
