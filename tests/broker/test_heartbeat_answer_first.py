"""A heartbeat that creates a group's retry topic is answered before the broker re-registers its topic table with
the namesrv: building the table for the registration runs after the answer's write, not before it. The broker's
real request path through an in-memory transport, with a real namesrv in the same loop."""
from __future__ import annotations

import asyncio
from pathlib import Path

import orjson

from sluice.broker.config import BrokerConfig
from sluice.broker.controller import BrokerController
from sluice.namesrv.server import NamesrvConfig, NamesrvServer
from sluice.protocol.codes import RequestCode, ResponseCode
from sluice.protocol.command import RemotingCommand

from recording import RecordingTransport, frames, wire


def _heartbeat(group: str) -> RemotingCommand:
    hb = {"clientID": "c1", "producerDataSet": [], "consumerDataSet": [{
        "groupName": group, "consumeType": "CONSUME_PASSIVELY", "messageModel": "CLUSTERING",
        "consumeFromWhere": "CONSUME_FROM_LAST_OFFSET", "subscriptionDataSet": [{
            "topic": "HbTopic", "subString": "*", "expressionType": "TAG", "subVersion": 1,
            "tagsSet": [], "codeSet": []}]}]}
    return RemotingCommand.request(RequestCode.HEART_BEAT, {}, orjson.dumps(hb))


def test_a_heartbeat_creating_a_retry_topic_is_answered_before_the_namesrv_registration(tmp_path: Path) -> None:
    log: list[tuple[str, object]] = []

    async def main() -> None:
        namesrv = NamesrvServer(NamesrvConfig(listen="127.0.0.1:0"))
        await namesrv.start()
        broker = BrokerController(BrokerConfig.load(None, listen="127.0.0.1:0", store=str(tmp_path / "s"),
                                                    namesrv=namesrv.address))
        await broker.start()
        try:
            register_all = broker.register_all

            async def recorded() -> None:
                log.append(("register", None))
                await register_all()
            broker.register_all = recorded  # type: ignore[method-assign]
            conn = broker.server._new_connection()
            RecordingTransport("client", log).connect(conn)
            conn.data_received(wire(_heartbeat("NewGroup"), 7))
            for _ in range(200):  # bounded: the heartbeat and the registration it starts
                if any(name == "register" for name, _ in log) and any(name == "client" for name, _ in log):
                    break
                await asyncio.sleep(0.005)
            assert broker.topics.get("%RETRY%NewGroup") is not None
        finally:
            await broker.stop()
            await namesrv.close()

    asyncio.run(main())
    order = [name for name, _ in log]
    assert order[:2] == ["client", "register"], order
    [answer] = [f for f in frames(log[0][1]) if f.is_response]  # type: ignore[arg-type]
    assert answer.opaque == 7 and answer.code == ResponseCode.SUCCESS
