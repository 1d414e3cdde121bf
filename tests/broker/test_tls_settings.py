"""TLS settings of the broker, the namesrv, the SDK and ``sluice admin``: defaults and precise refusals."""
from __future__ import annotations

import pytest

from sluice import Producer
from sluice.admin.core import AdminEnv
from sluice.broker.config import BrokerConfig
from sluice.client.instance import ClientConfig
from sluice.errors import InvalidParameterError
from sluice.namesrv.server import NamesrvConfig
from sluice.transport.tls import ClientTls


def test_broker_defaults_are_plain_and_checked() -> None:
    config = BrokerConfig.load(None)
    assert (config.tls_mode, config.tls_cert, config.tls_key, config.namesrv_tls) == ("disabled", "", "", False)
    assert config.namesrv_client_tls is None
    with pytest.raises(InvalidParameterError, match="tls_mode must be one of"):
        BrokerConfig.load(None, tls_mode="strict")
    with pytest.raises(InvalidParameterError, match="tls_mode enforcing needs tls_cert and tls_key"):
        BrokerConfig.load(None, tls_mode="enforcing", tls_cert="a.pem")
    with pytest.raises(InvalidParameterError, match="namesrv_tls is off"):
        BrokerConfig.load(None, namesrv_tls_ca="ca.pem")
    config = BrokerConfig.load(None, tls_mode="Permissive", tls_cert="c.pem", tls_key="k.pem", namesrv_tls=True,
                               namesrv_tls_ca="ca.pem", namesrv_tls_verify=False)
    assert config.tls_mode == "permissive"
    assert config.namesrv_client_tls == ClientTls(ca="ca.pem", verify=False)


def test_namesrv_settings() -> None:
    assert NamesrvConfig().tls_mode == "disabled"
    with pytest.raises(InvalidParameterError, match="tls_mode permissive needs tls_cert and tls_key"):
        NamesrvConfig(tls_mode="permissive")
    assert NamesrvConfig(tls_mode="ENFORCING", tls_cert="c", tls_key="k").tls_mode == "enforcing"


def test_sdk_options() -> None:
    assert ClientConfig().client_tls is None
    assert ClientConfig(tls=True).client_tls == ClientTls()  # system CAs, verification on
    assert ClientConfig(tls=True, tls_ca="ca.pem", tls_server_name="mq.example").client_tls == \
        ClientTls(ca="ca.pem", server_name="mq.example")
    with pytest.raises(InvalidParameterError, match="pass tls=True too"):
        ClientConfig(tls_ca="ca.pem")
    with pytest.raises(InvalidParameterError, match="pass tls=True too"):
        Producer("PG_tls_opts", "127.0.0.1:9876", tls_ca="ca.pem")


def test_admin_flags_and_environment() -> None:
    assert AdminEnv(env={}).client_tls() is None
    assert AdminEnv(env={"SLUICE_TLS": "1"}).client_tls() == ClientTls()
    assert AdminEnv(env={"SLUICE_TLS_CA": "/x/ca.pem"}).client_tls() == ClientTls(ca="/x/ca.pem")
    assert AdminEnv(env={"SLUICE_TLS_CA": "/x/ca.pem"}, tls_ca="/y/ca.pem").client_tls() == ClientTls(ca="/y/ca.pem")
    assert AdminEnv(env={"SLUICE_TLS": "0"}, tls=True).client_tls() == ClientTls()


def test_relative_tls_files_in_a_toml_file_are_beside_it(tmp_path) -> None:  # type: ignore[no-untyped-def]
    etc = tmp_path / "etc"
    etc.mkdir()
    (etc / "broker.toml").write_text('tls_mode = "enforcing"\ntls_cert = "tls/server.pem"\ntls_key = "tls/server.key"\n'
                                     'tls_client_ca = "tls/ca.pem"\nnamesrv_tls = true\nnamesrv_tls_ca = "/abs/ca.pem"\n')
    config = BrokerConfig.load(etc / "broker.toml")
    assert (config.tls_cert, config.tls_key, config.tls_client_ca) == (
        str(etc / "tls/server.pem"), str(etc / "tls/server.key"), str(etc / "tls/ca.pem"))
    assert config.namesrv_tls_ca == "/abs/ca.pem"
    assert BrokerConfig.load(etc / "broker.toml", tls_cert="mine.pem").tls_cert == "mine.pem"  # flags stay as given


def test_namesrv_relative_tls_files_in_a_toml_file_are_beside_it(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from sluice.namesrv.cli import load_config_file
    conf = tmp_path / "namesrv.toml"
    conf.write_text('tls_mode = "enforcing"\ntls_cert = "server.pem"\ntls_key = "/abs/server.key"\n'
                    'tls_client_ca = "ca.pem"\n')
    out = load_config_file(conf)
    assert (out["tls_cert"], out["tls_key"], out["tls_client_ca"]) == (
        str(tmp_path / "server.pem"), "/abs/server.key", str(tmp_path / "ca.pem"))
