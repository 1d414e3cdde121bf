"""GET_CONSUMER_RUNNING_INFO (307): a push consumer's state as RocketMQ's ``ConsumerRunningInfo``.

A broker relays this request from admin tools (mqadmin consumerStatus) to a
client about one of its groups (ClientRemotingProcessor.getConsumerRunningInfo).
The answer, minimal but in Java's shape::

    {"properties": {...}, "subscriptionSet": [SubscriptionData...],
     "mqTable": {{"brokerName":..,"queueId":..,"topic":..}: ProcessQueueInfo, ...}}

``mqTable`` is keyed by the queue object itself, as fastjson writes a
``TreeMap<MessageQueue, ProcessQueueInfo>`` (what Java tools decode;
:func:`sluice.protocol.offset_table.decode_queue_table` with ``key="mqTable"``
reads it). Per owned queue: the offset the consumer would commit, the cached
messages (count, size, offset range; orderly: those with the listener as the
"transaction" figures, as ProcessQueue.fillProcessQueueInfo does), lock state
and timestamps. Sluice keeps no pull/consume RT and TPS figures, so
``statusTable`` is left out (Java reads it as empty).
"""
from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

import orjson

from sluice import __version__
from sluice.client.process_queue import ProcessQueue
from sluice.client.results import MessageQueue, queue_sort_key
from sluice.protocol import fields

if TYPE_CHECKING:
    from sluice.client.push_view import PushConsumerView

__all__ = ["consumer_running_info", "encode_running_info"]

MIB = 1024 * 1024


def _wall_ms(monotonic_s: float) -> int:
    """A time.monotonic() instant as epoch milliseconds (Java's timestamps are wall-clock)."""
    return int((time.time() - (time.monotonic() - monotonic_s)) * 1000)


def _queue_info(commit_offset: int, pq: ProcessQueue) -> dict[str, Any]:
    msgs, taken = pq.msgs, pq.consuming
    return {
        "commitOffset": commit_offset,
        "cachedMsgMinOffset": next(iter(msgs)) if msgs else 0,
        "cachedMsgMaxOffset": next(reversed(msgs)) if msgs else 0,
        "cachedMsgCount": len(msgs),
        "cachedMsgSizeInMiB": pq.msg_size // MIB,
        "transactionMsgMinOffset": min(taken) if taken else 0,
        "transactionMsgMaxOffset": max(taken) if taken else 0,
        "transactionMsgCount": len(taken),
        "locked": pq.locked,
        "tryUnlockTimes": 0,
        "lastLockTimestamp": _wall_ms(pq.last_lock_time) if pq.last_lock_time else 0,
        "droped": pq.dropped,  # sic: Java's field name
        "lastPullTimestamp": _wall_ms(pq.last_pull_time),
        "lastConsumeTimestamp": _wall_ms(pq.last_consume_time),
    }


def consumer_running_info(consumer: PushConsumerView) -> tuple[dict[str, Any], dict[MessageQueue, dict[str, Any]]]:
    """(the document without ``mqTable``, the queue table); call on the consumer's event loop."""
    o = consumer.options
    data = consumer.consumer_data()
    props = {
        "consumerGroup": consumer.group,
        "messageModel": o.message_model,
        "consumeFromWhere": o.consume_from_where,
        "consumeThreadMax": str(o.consume_thread_max),
        "consumeMessageBatchMaxSize": str(o.consume_message_batch_max_size),
        "pullBatchSize": str(o.pull_batch_size),
        "pullThresholdForQueue": str(o.pull_threshold_for_queue),
        "maxReconsumeTimes": str(o.max_reconsume_times),
        "PROP_NAMESERVER_ADDR": ";".join(consumer.instance.namesrv_addrs),
        "PROP_CONSUME_TYPE": data.consume_type,
        "PROP_CONSUMEORDERLY": str(consumer.orderly).lower(),
        # consume_inline: the listener runs on the client's loop thread, no pool (Sluice's own key below)
        "PROP_THREADPOOL_CORE_SIZE": "0" if o.consume_inline else str(o.consume_thread_max),
        "consumeInline": str(o.consume_inline).lower(),
        "PROP_CONSUMER_START_TIMESTAMP": str(consumer.start_timestamp_ms),
        "PROP_CLIENT_VERSION": f"sluice-{__version__}",
    }
    doc = {"properties": props, "subscriptionSet": [fields.to_jsonable(s) for s in data.subscription_data_set]}
    store = consumer.offset_store
    table = {mq: _queue_info(store.read_memory(mq), pq)
             for mq, pq in sorted(consumer.rebalancer.process_queues.items(), key=lambda kv: queue_sort_key(kv[0]))}
    return doc, table


def encode_running_info(doc: dict[str, Any], table: dict[MessageQueue, dict[str, Any]]) -> bytes:
    """``doc`` with ``mqTable`` in fastjson's object-key form."""
    items = [orjson.dumps({"brokerName": mq.broker_name, "queueId": mq.queue_id, "topic": mq.topic})
             + b":" + orjson.dumps(info) for mq, info in table.items()]
    head = orjson.dumps(doc)
    return head[:-1] + b',"mqTable":{' + b",".join(items) + b"}}"
