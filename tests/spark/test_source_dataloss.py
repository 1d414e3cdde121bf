"""failOnDataLoss: ranges that retention removed, against a real broker with tiny segments."""
from __future__ import annotations

import time

import pytest
from servers import running_cluster

pytestmark = [pytest.mark.spark, pytest.mark.slow, pytest.mark.integration]


@pytest.fixture(scope="module")
def retained(tmp_path_factory):
    """A broker whose first segments are gone: (namesrv, broker name, queue 0's new minimum)."""
    from sluice.client import Producer, PullConsumer
    from sluice.message import Message

    config = ("commitlog_file_size = 131072\nmax_message_size = 65536\nretention_hours = 0.0003\n"
              "default_topic_queue_nums = 1\n")
    with running_cluster(tmp_path_factory.mktemp("retention"), config=config) as cluster:
        with Producer("loss-producer", cluster.ns) as p:
            for i in range(400):
                p.send(Message("Lossy", b"x" * 1000, tags="T", properties={"i": str(i)}))
        c = PullConsumer("loss-probe", cluster.ns)
        c.start()
        try:
            [mq] = c.fetch_message_queues("Lossy")
            deadline = time.monotonic() + 60
            while c.min_offset(mq) == 0:
                if time.monotonic() > deadline:
                    pytest.fail("retention removed nothing within 60 s")
                time.sleep(0.5)
            yield cluster.ns, mq.broker_name, c.min_offset(mq)
        finally:
            c.shutdown()


def test_requested_range_already_deleted(spark, retained):
    ns, broker, lo = retained
    r = (spark.read.format("sluice").option("namesrv", ns).option("topic", "Lossy")
         .option("startingOffsets", '{"Lossy": {"%s:0": 0}}' % broker))
    with pytest.raises(Exception, match="data loss"):
        r.load().count()
    rows = r.option("failOnDataLoss", "false").load().select("queue_offset").collect()
    assert min(x.queue_offset for x in rows) == lo and len(rows) == 400 - lo
    assert spark.read.format("sluice").option("namesrv", ns).option("topic", "Lossy").load().count() == 400 - lo
