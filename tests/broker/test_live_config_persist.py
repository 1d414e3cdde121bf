"""UPDATE_BROKER_CONFIG changes survive a restart (live_config.LiveConfigFile), as RocketMQ's do
(remoting/src/main/java/org/apache/rocketmq/remoting/Configuration.java: update() then persist()):
unit tests of the kept file, and a real ``sluice broker`` subprocess updated with ``sluice admin
updateBrokerConfig``, restarted, and asked again."""
from __future__ import annotations

import logging
import os
import subprocess
import sys
from pathlib import Path

import orjson
import pytest
from servers import running_cluster

from sluice import Message, Producer
from sluice.broker.config import BrokerConfig
from sluice.broker.live_config import LiveConfigFile, check_update

# ---------------------------------------------------------------------------------------- the kept file


def test_kept_settings_accumulate_and_overlay_a_fresh_config(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    f = LiveConfigFile(tmp_path)
    assert f.kept() == {} and f.overlay(BrokerConfig()) == BrokerConfig()  # no file: nothing changes
    f.save(check_update(BrokerConfig(), {"maxTransferCountOnMessageInMemory": "7"})[0])
    f.save(check_update(BrokerConfig(), {"autoCreateTopicEnable": "false", "max_reconsume_times": "3"})[0])
    assert f.kept() == {"maxTransferCountOnMessageInMemory": "7", "autoCreateTopicEnable": "false",
                        "maxReconsumeTimes": "3"}
    base = BrokerConfig(max_transfer_count=20, broker_name="b1")  # as the command line / TOML gave it
    with caplog.at_level(logging.INFO, logger="sluice.broker.live_config"):
        cfg = f.overlay(base)
    assert (cfg.max_transfer_count, cfg.auto_create_topic, cfg.max_reconsume_times) == (7, False, 3)
    assert cfg.broker_name == "b1"
    line = caplog.text
    assert "maxTransferCountOnMessageInMemory=7 (was 20)" in line and "autoCreateTopicEnable=false (was" in line
    assert "override the command line / TOML" in line
    f.save(check_update(cfg, {"maxTransferCountOnMessageInMemory": "9"})[0])  # a later change replaces
    assert f.kept()["maxTransferCountOnMessageInMemory"] == "9"
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="sluice.broker.live_config"):
        same = f.overlay(BrokerConfig(max_transfer_count=9, auto_create_topic=False, max_reconsume_times=3))
    assert same.max_transfer_count == 9 and "override" not in caplog.text  # nothing differs: nothing to say


def test_kept_values_a_broker_cannot_take_are_left_out_with_an_error(tmp_path: Path,
                                                                     caplog: pytest.LogCaptureFixture) -> None:
    (tmp_path / "liveConfig.json").write_bytes(orjson.dumps({"settings": {
        "brokerName": "other", "noSuchSetting": "1", "maxTransferCountOnMessageInMemory": "0",
        "longPollingEnable": "false"}}))
    with caplog.at_level(logging.INFO, logger="sluice.broker.live_config"):
        cfg = LiveConfigFile(tmp_path).overlay(BrokerConfig())
    assert cfg == BrokerConfig(long_polling_enable=False)  # only the one valid live setting applies
    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 3
    assert any("brokerName=other left out" in e and "cannot change" in e for e in errors)
    assert any("noSuchSetting=1 left out" in e for e in errors)
    assert any("maxTransferCountOnMessageInMemory=0 left out" in e for e in errors)


@pytest.mark.parametrize("raw", [b"not json", b"[1, 2]", b'{"settings": 5}'])
def test_a_damaged_file_starts_with_the_given_config(tmp_path: Path, raw: bytes,
                                                     caplog: pytest.LogCaptureFixture) -> None:
    (tmp_path / "liveConfig.json").write_bytes(raw)
    with caplog.at_level(logging.ERROR):
        assert LiveConfigFile(tmp_path).overlay(BrokerConfig()) == BrokerConfig()
    assert "liveConfig.json" in caplog.text


# ---------------------------------------------------------------------------------------- a real restart

def admin(ns: str, *argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "sluice", "admin", *argv, "-n", ns], capture_output=True,
                          text=True, timeout=60, env={**os.environ, "COLUMNS": "200"})


def broker_config(ns: str, addr: str) -> dict[str, str]:
    r = admin(ns, "getBrokerConfig", "-b", addr, "--json")
    assert r.returncode == 0, r.stderr
    return orjson.loads(r.stdout)["brokers"][0]["config"]


@pytest.mark.integration
@pytest.mark.timeout(180)
def test_update_broker_config_is_kept_across_a_restart(tmp_path: Path) -> None:
    toml = "max_transfer_count = 20\nauto_create_topic = true\n"
    with running_cluster(tmp_path, ("broker-a",), config=toml) as c:
        addr = c.broker.addr
        assert broker_config(c.ns, addr)["maxTransferCountOnMessageInMemory"] == "20"
        for k, v in (("maxTransferCountOnMessageInMemory", "7"), ("autoCreateTopicEnable", "false")):
            r = admin(c.ns, "updateBrokerConfig", "-b", addr, "-k", k, "-v", v)
            assert r.returncode == 0, r.stderr
        refused = admin(c.ns, "updateBrokerConfig", "-b", addr, "-k", "brokerName", "-v", "other")
        assert refused.returncode != 0  # a refused update is not kept either
        kept = orjson.loads((c.store() / "config" / "liveConfig.json").read_bytes())
        assert kept == {"settings": {"autoCreateTopicEnable": "false", "maxTransferCountOnMessageInMemory": "7"}}

        b = c.restart_broker()
        err = b.wait_for_stderr("override the command line / TOML values")
        assert "maxTransferCountOnMessageInMemory=7 (was 20)" in err
        assert "autoCreateTopicEnable=false (was true)" in err
        cfg = broker_config(c.ns, b.addr)
        assert cfg["maxTransferCountOnMessageInMemory"] == "7" and cfg["autoCreateTopicEnable"] == "false"
        assert cfg["brokerName"] == "broker-a"
        # The kept value is the one the broker runs with: a send to a topic nobody created is refused.
        with Producer("LivePersistProducer", namesrv=c.ns) as p, pytest.raises(Exception, match="auto"):
            p.send(Message("LiveNeverCreated", b"x"))
        # Changing it back live is kept too.
        r = admin(c.ns, "updateBrokerConfig", "-b", b.addr, "-k", "autoCreateTopicEnable", "-v", "true")
        assert r.returncode == 0, r.stderr
        b = c.restart_broker()
        assert broker_config(c.ns, b.addr)["autoCreateTopicEnable"] == "true"
