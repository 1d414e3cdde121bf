"""`sluice spark scan|stats|backfill` as a user runs them (issue 13): an existing output is never deleted
silently, a typo'd topic or a store path executors cannot use is one clear line, progress on a terminal
(nothing when piped or --quiet), a closing summary."""
from __future__ import annotations

import os
import pty
import select
import subprocess
import sys
import time
from pathlib import Path

import orjson
import pytest

from sluice.store import MessageStore, StoreConfig, StoreMessage

SLUICE = [sys.executable, "-m", "sluice", "spark"]


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("clistore") / "store"
    with MessageStore(root, StoreConfig(commitlog_file_size=1 << 20, max_message_size=64 * 1024)) as st:
        for i in range(60):
            st.put_message(StoreMessage("Orders", f"m{i}".encode(), queue_id=i % 2,
                                        properties={"TAGS": "Paid" if i % 3 else "New", "amount": str(i * 10),
                                                    "region": ("eu", "us", "ap")[i % 3]}))
        st.wait_dispatched()
    return root


def run(*args: str, cwd: Path | None = None, timeout: float = 240) -> subprocess.CompletedProcess:
    return subprocess.run([*SLUICE, *args], capture_output=True, text=True, timeout=timeout, cwd=cwd)


def run_in_pty(argv: list[str], cwd: Path, timeout: float = 240) -> tuple[int, str]:
    """Run ``argv`` with stdout and stderr on a pseudo-terminal; (exit status, everything it drew)."""
    master, slave = pty.openpty()
    env = {**os.environ, "TERM": "xterm-256color", "COLUMNS": "120"}
    proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=slave, stderr=slave, cwd=cwd, env=env)
    os.close(slave)
    chunks: list[bytes] = []
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([master], [], [], 0.5)
            if ready:
                try:
                    data = os.read(master, 65536)
                except OSError:  # EIO: the child closed the terminal
                    break
                if not data:
                    break
                chunks.append(data)
            elif proc.poll() is not None:
                break
        rc = proc.wait(timeout=max(1.0, deadline - time.monotonic()))
    finally:
        if proc.poll() is None:
            proc.kill()
        os.close(master)
    return rc, b"".join(chunks).decode("utf-8", "replace")


# ---------------------------------------------------------------- refused before Spark starts (fast)

def test_scan_refuses_a_non_empty_out_dir_and_keeps_it(store, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "precious.txt").write_text("keep me")
    r = run("scan", str(store), "--out", str(out), "--topic", "Orders", timeout=60)
    assert r.returncode != 0
    assert "not empty" in r.stderr and "--overwrite" in r.stderr
    assert (out / "precious.txt").read_text() == "keep me"
    f = tmp_path / "a-file"
    f.write_text("x")
    r = run("scan", str(store), "--out", str(f), timeout=60)
    assert r.returncode != 0 and "not a directory" in r.stderr and f.read_text() == "x"


@pytest.mark.parametrize("command", [
    ["scan", "--out", "{tmp}/o", "--topic", "Ordres"],
    ["stats", "--topic", "Ordres"],
    ["backfill", "--topic", "Ordres", "--group", "g", "--selector", "amount > 5", "--out", "{tmp}/bf"],
])
def test_an_unknown_topic_is_an_error_naming_it(store, tmp_path, command):
    args = [command[0], str(store), *(a.format(tmp=tmp_path) for a in command[1:])]
    r = run(*args, timeout=60)
    assert r.returncode == 1, r.stdout + r.stderr
    assert "unknown topic Ordres" in r.stderr and "Orders" in r.stderr  # names the typo and what exists
    assert len(r.stderr.strip().splitlines()) == 1
    assert r.stdout == ""


def test_a_directory_that_is_not_a_store_is_one_line(tmp_path):
    (tmp_path / "notastore").mkdir()
    for args in (["scan", "notastore", "--out", "o"], ["stats", "notastore"]):
        r = run(*args, cwd=tmp_path, timeout=60)
        assert r.returncode == 1
        lines = r.stderr.strip().splitlines()
        assert len(lines) == 1 and "is not a Sluice store" in lines[0]
        assert str(tmp_path / "notastore") in lines[0]  # the absolute path the job would have used


# ---------------------------------------------------------------- real jobs (a SparkSession each)

@pytest.mark.spark
@pytest.mark.slow
def test_scan_overwrite_with_a_relative_store_path_piped(store, tmp_path):
    """Relative paths are made absolute (executors do not share the driver's working directory); piped
    output gets no progress display, only the JSON on stdout and the summary line on stderr."""
    work = store.parent
    out = work / "scanned"
    out.mkdir(exist_ok=True)
    (out / "old.txt").write_text("old")
    r = run("scan", store.name, "--out", "scanned", "--overwrite", "--topic", "Orders", "--selector", "amount >= 300",
            "--master", "local[1]", cwd=work)
    assert r.returncode == 0, r.stderr[-3000:]
    result = orjson.loads(r.stdout.strip().splitlines()[-1])
    assert result == {"store": str(store), "out": str(out), "messages": 30}
    assert not (out / "old.txt").exists()
    assert "\x1b[" not in r.stderr and "tasks" not in r.stderr  # no progress display off a terminal
    summary = [ln for ln in r.stderr.splitlines() if ln.startswith("scan: ")]
    assert len(summary) == 1 and "30 messages of Orders" in summary[0] and str(out) in summary[0]


@pytest.mark.spark
@pytest.mark.slow
def test_stats_on_a_terminal_shows_progress_then_a_summary_and_plots(store, tmp_path):
    png = tmp_path / "stats.png"
    rc, screen = run_in_pty([*SLUICE, "stats", str(store), "--master", "local[1]", "--plot", str(png)], tmp_path)
    assert rc == 0, screen[-3000:]
    assert "stats: " in screen and "tasks" in screen  # the rich display: phase and task counts
    assert "stats: Spark UI at http://" in screen  # the UI stays on, and the user is told where
    assert "stats: 60 messages in 1 topic(s), plot in " + str(png) in screen.replace("\r\n", " ").replace("\n", " ")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.spark
@pytest.mark.slow
def test_backfill_quiet_prints_only_its_manifest(store, tmp_path):
    rc, screen = run_in_pty([*SLUICE, "backfill", str(store), "--topic", "Orders", "--group", "g",
                             "--selector", "region = 'eu'", "--out", "bf", "--master", "local[1]", "--quiet"],
                            tmp_path)
    assert rc == 0, screen[-3000:]
    assert "tasks" not in screen and "backfill: " not in screen  # --quiet: no display, no summary
    manifest = orjson.loads((tmp_path / "bf" / "manifest.json").read_bytes())
    assert sum(q["matched"] for q in manifest["queues"].values()) == 20
    assert manifest["queues"]["0"]["file"].startswith(str(tmp_path / "bf"))  # --out made absolute


def test_a_bad_selector_is_one_line_before_a_jvm_starts(store, tmp_path):
    r = run("scan", str(store), "--out", str(tmp_path / "o"), "--selector", "amount >", timeout=60)
    assert r.returncode == 1
    lines = r.stderr.rstrip().splitlines()
    # one line, then the selector's caret excerpt; no Spark text
    assert lines[0].startswith("Error: Invalid SQL92 selector") and lines[1:] == ["  amount >", "          ^"], r.stderr


def test_a_bad_master_is_refused_before_a_jvm_starts(store, tmp_path):
    r = run("scan", str(store), "--out", str(tmp_path / "o"), "--master", "nonsense://x", timeout=60)
    assert r.returncode == 2
    assert "'nonsense://x' is not a Spark master" in r.stderr and "at org.apache" not in r.stderr


@pytest.mark.spark
@pytest.mark.slow
def test_an_error_inside_spark_tasks_is_one_line(store, tmp_path):
    """A damaged record fails a task deep inside Spark: the user gets the Sluice error, once, on one line."""
    import shutil

    bad = tmp_path / "bad"
    shutil.copytree(store, bad)
    seg = bad / "commitlog" / f"{0:020d}"
    data = bytearray(seg.read_bytes())
    at = data.index(b"m25") + 1
    data[at] ^= 0xFF  # a body byte: the record stays walkable, its CRC no longer matches
    seg.write_bytes(bytes(data))
    r = run("scan", str(bad), "--out", str(tmp_path / "o"), "--master", "local[1]")
    assert r.returncode == 1
    lines = [ln for ln in r.stderr.splitlines() if ln.strip() and not ln.startswith("WARNING: Using incubator")]
    assert len(lines) == 1, r.stderr[-3000:]
    assert lines[0].startswith("Error: CorruptRecordError: body CRC mismatch") and str(seg) in lines[0]
