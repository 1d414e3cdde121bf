"""`sluice spark scan|stats` as a user runs them (a real subprocess, its own SparkSession)."""
from __future__ import annotations

import subprocess
import sys

import orjson
import pytest

from sluice.store import MessageStore, StoreConfig, StoreMessage

pytestmark = [pytest.mark.spark, pytest.mark.slow]


def test_stats_command_with_a_subscription(tmp_path):
    store = tmp_path / "store"
    with MessageStore(store, StoreConfig(commitlog_file_size=1 << 20, max_message_size=64 * 1024)) as st:
        st.put_messages([StoreMessage("T", f"m{i}".encode(), properties={"TAGS": "A" if i % 2 else "B", "x": str(i)})
                         for i in range(50)])
        st.wait_dispatched()
    # `spark scan --selector` is test_cli_jobs.py's piped scan; this is stats with a subscription
    r = subprocess.run([sys.executable, "-m", "sluice", "spark", "stats", str(store), "--selector", "T:TAG:A",
                        "--master", "local[1]"], capture_output=True, text=True, timeout=240)
    assert r.returncode == 0, r.stderr[-2000:]
    s = orjson.loads(r.stdout[r.stdout.index("{"):])
    assert s["T"]["messages"] == 50 and s["T"]["tags"] == {"A": 25, "B": 25}
    assert s["T"]["subscriptions"][0]["hit_rate"] == 0.5
    bad = subprocess.run([sys.executable, "-m", "sluice", "spark", "stats", str(store), "--selector", "T:a >"],
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode != 0 and "SQL92" in bad.stderr
