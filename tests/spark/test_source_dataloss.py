"""failOnDataLoss: ranges that retention removed, against a real broker with tiny segments."""
from __future__ import annotations

import time

import pytest
from servers import SluiceProcess

from sluice.errors import SluiceError
from sluice.namesrv.client import SyncNamesrvClient

pytestmark = [pytest.mark.spark, pytest.mark.slow, pytest.mark.integration]


def _wait_route(ns: str, topic: str, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    with SyncNamesrvClient(ns) as c:
        while True:
            try:
                if c.get_route(topic).broker_datas:
                    return
            except SluiceError:
                pass
            if time.monotonic() > deadline:
                raise TimeoutError(f"no route for {topic}")
            time.sleep(0.1)


@pytest.fixture(scope="module")
def retained(tmp_path_factory):
    """A broker whose first segments are gone: (namesrv, broker name, queue 0's new minimum)."""
    from sluice.client import Producer, PullConsumer
    from sluice.message import Message

    tmp = tmp_path_factory.mktemp("retention")
    conf = tmp / "broker.toml"
    conf.write_text("commitlog_file_size = 131072\nmax_message_size = 65536\nretention_hours = 0.0003\n"
                    "default_topic_queue_nums = 1\n")
    with SluiceProcess.start(["namesrv"], tmp, name="namesrv") as ns:
        with SluiceProcess.start(["broker", "--namesrv", ns.addr, "--store", str(tmp / "store"),
                                  "--config", str(conf)], tmp, name="broker"):
            _wait_route(ns.addr, "TBW102")
            with Producer("loss-producer", ns.addr) as p:
                for i in range(400):
                    p.send(Message("Lossy", b"x" * 1000, tags="T", properties={"i": str(i)}))
            c = PullConsumer("loss-probe", ns.addr)
            c.start()
            try:
                [mq] = c.fetch_message_queues("Lossy")
                deadline = time.monotonic() + 60
                while c.min_offset(mq) == 0:
                    if time.monotonic() > deadline:
                        pytest.fail("retention removed nothing within 60 s")
                    time.sleep(0.5)
                yield ns.addr, mq.broker_name, c.min_offset(mq)
            finally:
                c.shutdown()


def test_requested_range_already_deleted(spark, retained):
    ns, broker, lo = retained
    r = (spark.read.format("sluice").option("namesrv", ns).option("topic", "Lossy")
         .option("startingOffsets", '{"%s": {"0": 0}}' % broker))
    with pytest.raises(Exception, match="data loss"):
        r.load().count()
    rows = r.option("failOnDataLoss", "false").load().select("queue_offset").collect()
    assert min(x.queue_offset for x in rows) == lo and len(rows) == 400 - lo
    assert spark.read.format("sluice").option("namesrv", ns).option("topic", "Lossy").load().count() == 400 - lo
