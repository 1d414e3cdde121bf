"""The SDK through real filter servers (uploads off, the default): push and pull consumers get exactly their
class's messages; each kind of bad class fails loudly to its own group only; uploads are refused."""
from __future__ import annotations

import asyncio
import itertools
import re
import threading
from collections.abc import Iterator

import orjson
import pytest
from sdk_class_support import (Cluster, admin, class_cluster, pull_numbers, pull_numbers_sync, send_numbered,
                               wait_for, EVEN_SOURCE)

from sluice import ConsumeResult, MessageSelector, PushConsumer
from sluice.errors import FilterClassError, FilterClassFailedError, FilterClassImportError, FilterClassUploadRefusedError
from sluice.protocol.codes import ResponseCode

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(300)]

N = 60
_names = itertools.count()


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    with class_cluster(tmp_path_factory.mktemp("classes")) as c:
        yield c


@pytest.fixture
def topic(cluster: Cluster) -> str:
    t = f"CF{next(_names)}"
    send_numbered(cluster.ns, t, 0, N)
    return t


def test_pull_consumer_gets_exactly_the_classes_messages(cluster: Cluster, topic: str):
    got = pull_numbers_sync(cluster.ns, f"even_{topic}", topic, MessageSelector.by_class("evens:Even"))
    assert sorted(got) == [i for i in range(N) if i % 2 == 0]
    got = pull_numbers_sync(cluster.ns, f"third_{topic}", topic, MessageSelector.by_class("thirds:Third"))
    assert sorted(got) == [i for i in range(N) if i % 3 == 0]


def test_push_consumer_gets_exactly_the_classes_messages(cluster: Cluster, topic: str):
    got: list[int] = []
    lock = threading.Lock()

    def listener(msgs) -> ConsumeResult:
        with lock:
            got.extend(int(m.properties["n"]) for m in msgs)
        return ConsumeResult.SUCCESS
    want = [i for i in range(N) if i % 2 == 1]
    c = PushConsumer(f"odd_{topic}", namesrv=cluster.ns, consume_from_where="CONSUME_FROM_FIRST_OFFSET")
    c.subscribe(topic, MessageSelector.by_class("odds:Odd"))
    c.register_listener(listener)
    c.start()
    try:
        wait_for(lambda: len(got) >= len(want), 60, "the odd messages at the listener")
        send_numbered(cluster.ns, topic, N, 10)  # arriving while consuming: long polling through the server
        want += [i for i in range(N, N + 10) if i % 2 == 1]
        wait_for(lambda: len(got) >= len(want), 60, "the new odd messages at the listener")
        assert c.class_filter_error(topic) is None
    finally:
        c.shutdown()
    assert sorted(got) == want


BAD = [("broken:Broken", r"no_such_module_for_sluice_tests"),
       ("raises:Raises", r"ZeroDivisionError"),
       ("hangs:Hangs", r"deadline|time|CPU"),
       ("hog:Hog", r"memory|Memory")]


@pytest.mark.parametrize(("name", "cause"), BAD, ids=[b[0].split(":")[0] for b in BAD])
def test_a_bad_class_fails_its_group_loudly_and_only_its_group(cluster: Cluster, topic: str, name: str,
                                                               cause: str):
    async def both() -> tuple[BaseException | list[int], list[int]]:
        bad = asyncio.ensure_future(pull_numbers(cluster.ns, f"bad_{topic}", topic, MessageSelector.by_class(name)))
        good = await pull_numbers(cluster.ns, f"good_{topic}", topic, MessageSelector.by_class("evens:Even"))
        try:
            return await bad, good
        except FilterClassError as exc:
            return exc, good
    bad, good = asyncio.run(both())
    assert sorted(good) == [i for i in range(N) if i % 2 == 0]
    assert isinstance(bad, FilterClassImportError if name.startswith("broken") else FilterClassFailedError), bad
    assert bad.class_name == name and name in str(bad)
    assert re.search(cause, str(bad)), str(bad)
    # the good group goes on being served by the same filter server after the failure
    again = pull_numbers_sync(cluster.ns, f"good2_{topic}", topic, MessageSelector.by_class("evens:Even"))
    assert sorted(again) == [i for i in range(N) if i % 2 == 0]


def test_push_consumer_and_consumer_progress_show_the_class_error(cluster: Cluster, topic: str):
    group = f"raises_{topic}"
    got: list[int] = []
    c = PushConsumer(group, namesrv=cluster.ns, consume_from_where="CONSUME_FROM_FIRST_OFFSET",
                     pull_time_delay_when_exception=0.3)
    c.subscribe(topic, MessageSelector.by_class("raises:Raises"))
    c.register_listener(lambda msgs: got.extend(int(m.properties["n"]) for m in msgs) or ConsumeResult.SUCCESS)
    c.start()
    try:
        err = wait_for(lambda: c.class_filter_error(topic), 60, "the class error on the consumer")
        assert "raises:Raises" in str(err) and "ZeroDivisionError" in str(err)

        def shown() -> str | None:
            status, _out, err = admin(cluster.ns, "consumerProgress", "-g", group, "-t", topic)
            return err if "class filter error" in err and "ZeroDivisionError" in err else None
        text = wait_for(shown, 30, "the class error in consumerProgress", interval=0.5)
        assert "raises:Raises" in text and f"group {group} on topic {topic}" in text
        status, out, _ = admin(cluster.ns, "consumerProgress", "-g", group, "-t", topic, "--json")
        data = orjson.loads(out)
        assert status == 6  # PARTIAL: a warning, not a plain success
        assert [e["className"] for e in data["classFilterErrors"]] == ["raises:Raises"]
        assert "ZeroDivisionError" in data["classFilterErrors"][0]["error"]
        # the broker cannot count a class's matches; the group committed nothing past unfiltered messages
        assert all(e["matchingLagBasis"] == "plain-lag" for e in data["offsetTable"])
        assert all(e["consumerOffset"] <= 0 for e in data["offsetTable"])
    finally:
        c.shutdown()
    assert got == []


def test_uploads_are_refused_by_default(cluster: Cluster, topic: str):
    with pytest.raises(FilterClassError) as info:
        pull_numbers_sync(cluster.ns, f"upload_{topic}", topic,
                          MessageSelector.by_class("uploaded:Even", EVEN_SOURCE))
    assert info.value.code == ResponseCode.NO_PERMISSION and "uploads" in str(info.value)
    assert isinstance(info.value, FilterClassUploadRefusedError)
    assert "uploaded:Even" in str(info.value)


def test_members_of_one_group_with_different_classes_conflict_loudly(cluster: Cluster, topic: str):
    from sluice import AsyncPullConsumer
    from sluice.errors import FilterClassConflictError
    group = f"conflict_{topic}"

    async def main() -> FilterClassConflictError:
        async with AsyncPullConsumer(group, namesrv=cluster.ns, instance_name="one") as a, \
                AsyncPullConsumer(group, namesrv=cluster.ns, instance_name="two") as b:
            mq = (await a.fetch_message_queues(topic))[0]
            first = await a.pull(mq, MessageSelector.by_class("evens:Even"), 0)
            assert all(int(m.properties["n"]) % 2 == 0 for m in first.msg_found_list)
            with pytest.raises(FilterClassConflictError) as info:
                await b.pull(mq, MessageSelector.by_class("odds:Odd"), 0)
            assert b.class_filter_error(topic) is not None
            return info.value
    err = asyncio.run(main())
    assert "evens:Even" in str(err) and "odds:Odd" in str(err) and err.code == ResponseCode.SUBSCRIPTION_NOT_LATEST


def test_consumer_connection_shows_a_class_subscription(cluster: Cluster, topic: str):
    group = f"conn_{topic}"
    c = PushConsumer(group, namesrv=cluster.ns, consume_from_where="CONSUME_FROM_FIRST_OFFSET")
    c.subscribe(topic, MessageSelector.by_class("evens:Even"))
    c.register_listener(lambda msgs: ConsumeResult.SUCCESS)
    c.start()
    try:
        status, out, err = admin(cluster.ns, "consumerConnection", "-g", group)
        assert status == 0, err
        row = next(line for line in out.splitlines() if line.strip().startswith(topic))
        assert "CLASS" in row and "evens:Even" in row
    finally:
        c.shutdown()
