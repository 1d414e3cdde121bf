"""How the ACL is wired: what each broker request asks (need_of), broker settings, the SDK's credentials=."""
from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from sluice import Credentials
from sluice.acl.policy import PUB, SUB, retry_topic
from sluice.acl.signing import SigningRemotingClient
from sluice.broker.acl import need_of
from sluice.broker.config import BrokerConfig
from sluice.broker.requests import ROUTE_BY_CODE
from sluice.client import AsyncProducer, AsyncPullConsumer, AsyncPushConsumer
from sluice.errors import InvalidParameterError
from sluice.protocol.bodies import ConsumerData, HeartbeatData, SubscriptionData, encode_body
from sluice.protocol.codes import RequestCode as R
from sluice.protocol.command import RemotingCommand


def need(code: R, fields: dict[str, str] | None = None, body: bytes = b""):  # type: ignore[no-untyped-def]
    return need_of(ROUTE_BY_CODE[int(code)], RemotingCommand.request(code, fields or {}, body))


def test_what_broker_requests_ask() -> None:
    assert need(R.SEND_MESSAGE_V2, {"a": "PG", "b": "T"}).resources == {"T": PUB}
    assert need(R.SEND_MESSAGE, {"producerGroup": "PG", "topic": "T"}).resources == {"T": PUB}
    # The send handler takes either naming with any send code: the topic it will write to is the one checked.
    for code in (R.SEND_MESSAGE, R.SEND_MESSAGE_V2, R.SEND_BATCH_MESSAGE):
        assert need(code, {"producerGroup": "PG", "topic": "Secret"}).resources == {"Secret": PUB}
        assert need(code, {"a": "PG", "b": "Secret"}).resources == {"Secret": PUB}
        assert need(code, {"producerGroup": "PG", "topic": "Secret", "a": "PG", "b": "T"}).resources == {"Secret": PUB}
    for code in (R.SEND_REPLY_MESSAGE, R.SEND_REPLY_MESSAGE_V2):  # a reply names its topic either way
        assert need(code, {"a": "PG", "b": "C_REPLY_TOPIC"}).resources == {"C_REPLY_TOPIC": PUB}
        assert need(code, {"producerGroup": "PG", "topic": "C_REPLY_TOPIC"}).resources == {"C_REPLY_TOPIC": PUB}
    assert need(R.PULL_MESSAGE, {"consumerGroup": "CG", "topic": "T"}).resources == {
        "T": SUB, retry_topic("CG"): SUB}
    assert need(R.CONSUMER_SEND_MSG_BACK, {"group": "CG", "originTopic": "T"}).resources == {
        "T": PUB, retry_topic("CG"): SUB}
    admin = need(R.UPDATE_AND_CREATE_TOPIC, {"topic": "T"})
    assert admin.admin and int(admin.code) == int(R.UPDATE_AND_CREATE_TOPIC)
    assert need(R.PUT_FILTER_BACKFILL).admin and need(R.INVOKE_BROKER_TO_RESET_OFFSET).admin
    hb = HeartbeatData(client_id="c", consumer_data_set=[ConsumerData(group_name="CG", subscription_data_set=[
        SubscriptionData(topic="T", sub_string="*"), SubscriptionData(topic=retry_topic("CG"), sub_string="*")])])
    assert need(R.HEART_BEAT, body=encode_body(hb)).resources == {retry_topic("CG"): SUB, "T": SUB}
    assert need(R.HEART_BEAT, body=b"not json").resources == {}  # the handler refuses it precisely


def test_broker_settings(tmp_path: Path) -> None:
    conf = tmp_path / "b.toml"
    conf.write_text('acl = "/etc/plain_acl.yml"\nacl_access_key = "brokeracct"\nacl_secret_key = "s3cret!"\n')
    c = BrokerConfig.load(conf)
    assert (c.acl, c.acl_access_key, c.acl_secret_key) == ("/etc/plain_acl.yml", "brokeracct", "s3cret!")
    assert BrokerConfig().acl == ""  # off by default
    with pytest.raises(InvalidParameterError, match="together"):
        BrokerConfig(acl_access_key="only-key").validate()


@pytest.mark.parametrize("cls", [AsyncProducer, AsyncPullConsumer, AsyncPushConsumer])
def test_every_client_signs_with_its_credentials(cls: type) -> None:
    creds = Credentials("sluiceuser", "user-secret-1")

    async def main() -> None:
        client = cls("G_wiring", "127.0.0.1:1", credentials=creds)
        inst = await client._join()
        try:
            assert isinstance(inst.remoting, SigningRemotingClient) and inst.remoting.credentials == creds
            plain = cls("G_wiring2", "127.0.0.1:1")
            other = await plain._join()
            try:
                assert other is not inst and not isinstance(other.remoting, SigningRemotingClient)
            finally:
                await plain._leave(other)
        finally:
            await client._leave(inst)
    asyncio.run(main())


def test_credentials_must_be_credentials() -> None:
    with pytest.raises(InvalidParameterError, match="credentials must be sluice.Credentials"):
        AsyncProducer("G", "127.0.0.1:1", credentials=("ak", "sk"))
