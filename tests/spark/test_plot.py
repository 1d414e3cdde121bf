"""`stats()`'s timeline and `sluice spark stats --plot`'s picture (plot_stats), on real store files."""
from __future__ import annotations

import time

import numpy as np
import pytest

from sluice.errors import InvalidParameterError
from sluice.store import MessageStore, StoreConfig, StoreMessage

pytestmark = [pytest.mark.spark, pytest.mark.slow]


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    root = tmp_path_factory.mktemp("plotstore") / "store"
    with MessageStore(root, StoreConfig(commitlog_file_size=1 << 20, max_message_size=64 * 1024)) as st:
        for step in range(3):  # three bursts over about two seconds: the timeline has several buckets
            st.put_messages([StoreMessage("Orders", b"o", properties={"TAGS": ("Paid", "New")[i % 2],
                                                                       "region": ("eu", "us", "ap")[i % 3]})
                             for i in range(100 * (step + 1))])
            st.put_messages([StoreMessage("Audit", b"a", properties={"TAGS": "Log"}) for _ in range(20)])
            time.sleep(1.1)
        st.wait_dispatched()
    return root


def test_stats_timeline_counts_every_message_once(spark, store):
    from sluice.spark.jobs import stats

    s = stats(spark, str(store), top=5)
    for topic, want in (("Orders", 600), ("Audit", 60)):
        tl = s[topic]["timeline"]
        assert s[topic]["messages"] == want == sum(tl["counts"])
        assert tl["bucket_seconds"] >= 1 and len(tl["counts"]) >= 3
    assert s["Orders"]["timeline"]["start_ms"] == s["Audit"]["timeline"]["start_ms"]  # shared buckets


def test_plot_draws_rate_and_top_values(spark, store, tmp_path):
    import matplotlib.image

    from sluice.spark.jobs import stats
    from sluice.spark.plot import plot_stats

    s = stats(spark, str(store), top=5)
    png = plot_stats(s, tmp_path / "sub" / "stats.png")
    img = matplotlib.image.imread(png)
    h, w = img.shape[:2]
    assert w >= 1000 and h >= 800
    ink = (img[:, :, :3] < 0.9).any(axis=2)
    top, bottom = ink[: h // 2], ink[h // 2:]
    assert top.mean() > 0.01 and bottom.mean() > 0.01  # the rate panel and the bar panels both drew
    blue = (np.abs(img[:, :, 0] - 0.12) < 0.05) & (np.abs(img[:, :, 2] - 0.71) < 0.05)  # tab:blue bars
    assert blue[h // 2:].mean() > 0.01


def test_plot_refusals(tmp_path):
    from sluice.spark.plot import plot_stats

    with pytest.raises(InvalidParameterError, match="PNG"):
        plot_stats({"T": {"messages": 1, "tags": {}, "properties": {}}}, tmp_path / "x.jpg")
    with pytest.raises(InvalidParameterError, match="nothing to plot"):
        plot_stats({}, tmp_path / "x.png")
