"""Store-file splitting and decoding (no Spark), and the scan/stats jobs over real store files."""
from __future__ import annotations

import orjson
import pyarrow as pa
import pytest

from sluice.errors import CorruptRecordError
from sluice.spark.storefiles import plan_splits, read_split
from sluice.store import MessageStore, StoreConfig, StoreMessage

CFG = StoreConfig(commitlog_file_size=256 * 1024, max_message_size=16 * 1024, index_enable=False)


def _props(i: int) -> dict[str, str]:
    if i % 7 == 0:
        return {"a": str(i)}
    return {"TAGS": f"Tag{i % 3}", "KEYS": f"k{i} o{i % 2}", "a": str(i), "region": ("eu", "us", "ap")[i % 3],
            "UNIQ_KEY": f"ID{i:08d}"}


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    root = tmp_path_factory.mktemp("store")
    with MessageStore(root, CFG) as st:
        for i in range(1500):
            st.put_message(StoreMessage("Orders" if i % 4 else "Audit", bytes([i % 251]) * (i * 13 % 900 + 1),
                                        queue_id=i % 4, properties=_props(i), born_timestamp=1_700_000_000_000 + i))
        st.wait_dispatched()
    return root


def _all(root, split_bytes, **kw):
    return pa.concat_tables([read_split(s, **kw) for s in plan_splits(root, split_bytes)])


def test_splits_are_record_aligned_and_cover_every_record(store):
    whole = _all(store, 1 << 30)
    for size in (4096, 50_000, 100_000):
        splits = plan_splits(store, size)
        assert len(splits) > len(plan_splits(store, 1 << 30))
        got = _all(store, size)
        assert got.column("commitlog_offset").to_pylist() == whole.column("commitlog_offset").to_pylist()
    assert whole.num_rows == 1500


def test_decoded_rows_equal_the_store_reader(store):
    t = _all(store, 64 * 1024)
    with MessageStore(store, CFG) as st:
        for r in t.to_pylist()[::11]:
            m = st.get_message_by_offset(r["commitlog_offset"])
            assert (r["topic"], r["queue_id"], r["queue_offset"], r["body"]) == (m.topic, m.queue_id,
                                                                                 m.queue_offset, m.body)
            assert dict(r["properties"]) == m.properties
            assert (r["msg_id"], r["offset_msg_id"], r["tags"], r["keys"]) == (m.msg_id, m.offset_msg_id, m.tags,
                                                                                m.keys)
            assert r["born_host"] == f"{m.born_host[0]}:{m.born_host[1]}"
            assert int(r["born_timestamp"].timestamp() * 1000) == m.born_timestamp


def test_topic_filter_in_the_reader(store):
    t = _all(store, 64 * 1024, topics=frozenset(["Audit"]))
    assert set(t.column("topic").to_pylist()) == {"Audit"} and t.num_rows == 375


def test_corrupt_body_is_reported_with_file_and_offset(tmp_path):
    with MessageStore(tmp_path, CFG) as st:
        res = st.put_messages([StoreMessage("T", b"hello world", properties={"a": "1"})])
        st.wait_dispatched()
    seg = tmp_path / "commitlog" / f"{0:020d}"
    data = bytearray(seg.read_bytes())
    at = data.index(b"hello world")
    data[at] ^= 0xFF
    seg.write_bytes(bytes(data))
    with pytest.raises(CorruptRecordError, match="CRC"):
        _all(tmp_path, 1 << 20)
    assert _all(tmp_path, 1 << 20, check_crc=False).num_rows == 1
    assert res[0].commitlog_offset == 0


@pytest.mark.spark
@pytest.mark.slow
def test_scan_and_stats_with_spark(spark, store, tmp_path):
    from sluice.filter import compile_selector
    from sluice.spark.jobs import scan, stats

    out = tmp_path / "out"
    n = scan(spark, str(store), str(out), topic="Orders", selector="a > 700 AND region IN ('eu','us')",
             split_bytes=64 * 1024)
    sel = compile_selector("SQL92", "a > 700 AND region IN ('eu','us')")
    want = sum(1 for i in range(1500) if i % 4 and sel.matches(_props(i)))
    assert n == want > 0
    rows = spark.read.parquet(str(out)).select("topic", "queue_offset").collect()
    assert {r.topic for r in rows} == {"Orders"}

    (store / "config").mkdir(exist_ok=True)
    (store / "config" / "consumerFilter.json").write_bytes(orjson.dumps({"filterDataByTopic": {"Orders": {
        "groupFilterData": {"g1": {"expressionType": "SQL92", "expression": "region = 'eu'", "deadTime": 0}}}}}))
    s = stats(spark, str(store), subscriptions=None, top=3)
    assert s["Orders"]["messages"] == 1125 and s["Audit"]["messages"] == 375
    assert sum(s["Orders"]["tags"].values()) == 1125
    sub = s["Orders"]["subscriptions"][0]
    want_eu = sum(1 for i in range(1500) if i % 4 and _props(i).get("region") == "eu")
    assert sub["matched"] == want_eu and abs(sub["hit_rate"] - want_eu / 1125) < 1e-9
    assert len(s["Orders"]["properties"]["region"]) == 3


def test_live_store_is_scanned_up_to_what_dispatch_has_seen(tmp_path):
    from sluice.spark.storefiles import _is_record_start, store_is_open

    st = MessageStore(tmp_path, CFG).start()
    try:
        st.put_messages([StoreMessage("T", b"m%d" % i, properties={"a": str(i)}) for i in range(20)])
        st.wait_dispatched()
        assert store_is_open(tmp_path)
        assert _all(tmp_path, 512).num_rows == 20
        seg = tmp_path / "commitlog" / f"{0:020d}"
        assert _is_record_start(seg, 0, 0) and not _is_record_start(seg, 8, 8)
    finally:
        st.close()
    assert not store_is_open(tmp_path)
    assert _all(tmp_path, 512).num_rows == 20


@pytest.mark.spark
@pytest.mark.slow
def test_backfill_bitmaps_match_the_broker_selector(spark, store, tmp_path):
    from sluice.filter import compile_selector
    from sluice.spark.backfill import backfill, read_bitmap, selector_hash

    expr = "a > 300 AND region <> 'ap'"
    sel = compile_selector("SQL92", expr)
    m = backfill(spark, str(store), "Orders", "g-new", expr, str(tmp_path / "bf"), split_bytes=64 * 1024)
    assert sorted(m["queues"]) == ["1", "2", "3"]
    for q in (1, 2, 3):
        head, bits = read_bitmap(m["queues"][str(q)]["file"])
        assert head["selector_sha256"] == selector_hash("SQL92", expr).hex()
        assert (head["first"], head["end"]) == (0, 375)
        want = [sel.matches(_props(4 * k + q)) for k in range(375)]
        assert bits.tolist() == want and head["matched"] == sum(want)


def test_tag_filter_in_the_reader(store):
    whole = _all(store, 64 * 1024)
    t = _all(store, 64 * 1024, tags=frozenset(["Tag1", "Tag2"]))
    want = [r for r in whole.to_pylist() if r["tags"] in ("Tag1", "Tag2")]
    assert t.to_pylist() == want and len(want) > 0


@pytest.mark.spark
@pytest.mark.slow
def test_store_source_pushdown_equals_spark_filtering(spark, store):
    df = spark.read.format("sluice_store").option("splitBytes", str(64 * 1024)).load(str(store))
    pushed = sorted(r.commitlog_offset for r in df.where("tags IN ('Tag0', 'Tag2') AND topic = 'Orders'")
                    .select("commitlog_offset").collect())
    everything = df.select("commitlog_offset", "tags", "topic").collect()
    assert pushed == sorted(r.commitlog_offset for r in everything
                            if r.tags in ("Tag0", "Tag2") and r.topic == "Orders") and pushed


@pytest.mark.spark
@pytest.mark.slow
def test_store_paths_executors_cannot_use_are_refused(spark, store, tmp_path, monkeypatch):
    """Issue 13: a relative store path failed on executors with a 52-line traceback."""
    from sluice.errors import InvalidParameterError, TopicNotExistError
    from sluice.spark.jobs import read_store

    monkeypatch.chdir(store.parent)
    assert read_store(spark, store.name, "Orders").count() == 1125  # made absolute on the driver
    with pytest.raises(Exception, match="is relative.*pass an absolute path"):
        spark.read.format("sluice_store").load(store.name).count()
    with pytest.raises(InvalidParameterError, match="does not exist"):
        read_store(spark, str(tmp_path / "gone"))
    with pytest.raises(TopicNotExistError, match="unknown topic Ordres"):
        read_store(spark, str(store), "Orders,Ordres")
