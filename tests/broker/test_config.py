from __future__ import annotations

import pytest

from sluice.broker.config import BrokerConfig, parse_namesrv_list
from sluice.errors import InvalidParameterError


def test_flags_win_over_file(tmp_path):
    f = tmp_path / "broker.toml"
    f.write_text('listen = "127.0.0.1:20911"\nflush = "sync"\nnamesrv = "127.0.0.1:1;127.0.0.1:2"\n')
    cfg = BrokerConfig.load(f, listen="127.0.0.1:30911", flush=None)
    assert cfg.listen == "127.0.0.1:30911" and cfg.flush == "sync"
    assert cfg.namesrv == ["127.0.0.1:1", "127.0.0.1:2"]


def test_broker_table_in_file(tmp_path):
    f = tmp_path / "b.toml"
    f.write_text('[broker]\nbroker_name = "b1"\nauto_create_topic = false\n')
    cfg = BrokerConfig.load(f)
    assert cfg.broker_name == "b1" and cfg.auto_create_topic is False


@pytest.mark.parametrize("bad", [{"flush": "maybe"}, {"listen": "nohost"}, {"listen": "h:99999"}, {"nonsense": 1},
                                 {"msg_trace_topic_name": "no spaces"}])
def test_bad_settings_are_named(bad):
    with pytest.raises(InvalidParameterError):
        BrokerConfig.load(None, **bad)


def test_bad_toml(tmp_path):
    f = tmp_path / "b.toml"
    f.write_text("listen = \n")
    with pytest.raises(InvalidParameterError, match="cannot read"):
        BrokerConfig.load(f)


def test_namesrv_list():
    assert parse_namesrv_list("a:1; b:2,c:3") == ["a:1", "b:2", "c:3"]
    with pytest.raises(InvalidParameterError):
        parse_namesrv_list("a:1;b")
