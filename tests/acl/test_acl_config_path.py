"""``acl = "FILE"`` in a TOML config names a file beside that config (relative paths resolved against the
config's folder, not the working directory), for the broker and the namesrv; flags stay cwd-relative."""
from __future__ import annotations

from pathlib import Path

import pytest
from servers import SluiceProcess

from sluice.broker.config import BrokerConfig
from sluice.namesrv.cli import load_config_file
from sluice.protocol.codes import RequestCode, ResponseCode
from sluice.protocol.command import RemotingCommand
from sluice.transport.blocking import SyncRemotingClient

ACL = """\
accounts:
  - accessKey: pathuser
    secretKey: path-secret-1
    admin: false
"""


def _conf(tmp_path: Path, text: str, name: str = "broker.toml") -> Path:
    folder = tmp_path / "etc" / "sluice"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / name).write_text(text)
    return folder / name


def test_broker_relative_acl_is_beside_the_config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    conf = _conf(tmp_path, 'acl = "plain_acl.yml"\n')
    assert BrokerConfig.load(conf).acl == str(tmp_path / "etc" / "sluice" / "plain_acl.yml")
    conf = _conf(tmp_path, '[broker]\nacl = "../acl/plain_acl.yml"\n')
    assert Path(BrokerConfig.load(Path("etc/sluice/broker.toml")).acl) == (
        tmp_path / "etc" / "sluice" / ".." / "acl" / "plain_acl.yml")  # a relative config path works too
    conf = _conf(tmp_path, 'acl = "/srv/plain_acl.yml"\n')
    assert BrokerConfig.load(conf).acl == "/srv/plain_acl.yml"  # absolute: as written
    assert BrokerConfig.load(conf, acl="mine.yml").acl == "mine.yml"  # the flag wins, relative to the cwd
    assert BrokerConfig.load(_conf(tmp_path, 'acl = ""\n')).acl == ""  # empty: ACL off


def test_namesrv_relative_acl_is_beside_the_config(tmp_path: Path) -> None:
    conf = _conf(tmp_path, 'acl = "ns_acl.yml"\n', "namesrv.toml")
    assert load_config_file(conf)["acl"] == str(tmp_path / "etc" / "sluice" / "ns_acl.yml")
    conf = _conf(tmp_path, '[namesrv]\nacl = "/srv/ns_acl.yml"\n', "namesrv.toml")
    assert load_config_file(conf)["acl"] == "/srv/ns_acl.yml"


@pytest.mark.slow
def test_a_broker_started_elsewhere_enforces_the_acl_beside_its_config(tmp_path: Path) -> None:
    conf = _conf(tmp_path, f'acl = "plain_acl.yml"\nstore = "{tmp_path / "store"}"\n')
    (conf.parent / "plain_acl.yml").write_text(ACL)
    # The subprocess runs in this process's working directory, which holds no plain_acl.yml.
    assert not (Path.cwd() / "plain_acl.yml").exists()
    with SluiceProcess.start(["broker", "--config", str(conf)], tmp_path, name="broker") as b:
        client = SyncRemotingClient()
        try:
            req = RemotingCommand.request(RequestCode.SEND_MESSAGE_V2, {"a": "PG", "b": "T", "c": "TBW102",
                                                                       "d": 4, "e": 0, "f": 0, "g": 0, "h": 0,
                                                                       "i": "", "j": 0, "k": False}, b"x")
            resp = client.invoke(b.addr, req, 10)
            assert resp.code == ResponseCode.NO_PERMISSION and "no AccessKey" in (resp.remark or "")
        finally:
            client.close()
        assert str(conf.parent / "plain_acl.yml") in b.wait_for_stderr("ACL on:")
