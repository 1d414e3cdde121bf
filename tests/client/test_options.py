"""Options and lifecycle errors that need no server."""
from __future__ import annotations

import pytest

from sluice import LitePullConsumer, Message, Producer, PullConsumer, PushConsumer
from sluice.client import AsyncProducer
from sluice.errors import ClientError, InvalidParameterError


def test_unknown_option_is_named():
    with pytest.raises(InvalidParameterError, match="sendTimeout"):
        Producer("G", "127.0.0.1:9876", sendTimeout=3)


@pytest.mark.parametrize("opts", [{"send_timeout": 0}, {"retry_times": -1}, {"compress_level": 11}])
def test_bad_producer_options(opts):
    with pytest.raises(InvalidParameterError):
        Producer("G", "127.0.0.1:9876", **opts)


def test_bad_consumer_options():
    with pytest.raises(InvalidParameterError):
        PullConsumer("G", "127.0.0.1:9876", message_model="PUSH")
    with pytest.raises(InvalidParameterError):
        PullConsumer("G", "127.0.0.1:9876", broker_suspend_max=40)


def test_options_split_between_producer_and_instance():
    p = AsyncProducer("G", "h:1;h:2", retry_times=5, heartbeat_interval=1.5)
    assert p.options.retry_times == 5 and p.client_config.heartbeat_interval == 1.5


def test_use_before_start_is_a_client_error():
    p = Producer("G", "127.0.0.1:9876")
    with pytest.raises(ClientError, match="not started"):
        p.send(Message("T", b"x"))
    with pytest.raises(ClientError, match="not started"):
        p.send_async(Message("T", b"x"))
    p.shutdown()  # harmless


def test_no_namesrv_or_group():
    with pytest.raises(InvalidParameterError):
        Producer("", "127.0.0.1:9876")


def test_pull_consumer_heartbeat_data_follows_selectors_used():
    from sluice import MessageSelector
    from sluice.client import AsyncPullConsumer
    c = AsyncPullConsumer("G", "127.0.0.1:9876", message_model="BROADCASTING")
    assert c.consumer_data().subscription_data_set == []
    c._note_subscription("T", MessageSelector.by_sql("a = 1"))
    d = c.consumer_data()
    assert (d.group_name, d.consume_type, d.message_model) == ("G", "CONSUME_ACTIVELY", "BROADCASTING")
    (sub,) = d.subscription_data_set
    assert (sub.topic, sub.expression_type, sub.sub_string) == ("T", "SQL92", "a = 1")
    c._note_subscription("T", MessageSelector.by_sql("a = 1"))
    assert c.consumer_data().subscription_data_set[0].sub_version == sub.sub_version  # unchanged selector
    c._note_subscription("T", MessageSelector.by_tag("X"))
    assert c.consumer_data().subscription_data_set[0].expression_type == "TAG"


@pytest.mark.parametrize("make", [
    lambda g: Producer(g, "127.0.0.1:9876"),
    lambda g: PullConsumer(g, "127.0.0.1:9876"),
    lambda g: PushConsumer(g, "127.0.0.1:9876"),
    lambda g: LitePullConsumer(g, "127.0.0.1:9876"),
])
def test_a_group_name_rocketmq_refuses_is_refused_naming_the_group(make):
    # RocketMQ's Validators.checkGroup: before, a pull consumer and a producer took "my group" and a push consumer
    # refused it as a bad *topic* '%RETRY%my group'.
    with pytest.raises(InvalidParameterError, match=r"group 'my group' contains ' '"):
        make("my group")
    with pytest.raises(InvalidParameterError, match="group 'a.b' contains '.'"):
        make("a.b")
    with pytest.raises(InvalidParameterError, match="limit is 255"):
        make("g" * 256)
    make("CID_orders-app|%v1")  # every allowed character


def test_the_async_twins_the_docs_name_are_importable_from_sluice():
    # docs/sdk.md names AsyncTransactionProducer as TransactionProducer's twin; only the latter was on the face.
    import sluice
    from sluice.client import AsyncTransactionProducer

    assert sluice.AsyncTransactionProducer is AsyncTransactionProducer
