"""The servers' logs: --log-level on broker and namesrv, --log-dir with size rotation (sizes from the TOML
config), the store's recovery report as one readable line, topic creation and deletion with who asked, and
no INFO line per replayed send (dedup.py's is rate-limited)."""
from __future__ import annotations

import logging
import subprocess
import sys
from pathlib import Path

import pytest
from servers import SluiceProcess, start_broker, wait_for, wait_for_route

from sluice import Message, Producer
from sluice.errors import InvalidParameterError
from sluice.logsetup import configure_logging

pytestmark = [pytest.mark.timeout(240)]


@pytest.fixture
def root_logging():
    """configure_logging replaces the root logger's handlers: put pytest's back after."""
    root = logging.getLogger()
    saved = root.handlers[:], root.level
    yield
    for h in root.handlers:
        if h not in saved[0]:
            h.close()
    root.handlers[:] = saved[0]
    root.setLevel(saved[1])


def test_configure_logging_rotates_by_size(tmp_path: Path, root_logging) -> None:
    path = configure_logging("INFO", name="unit", log_dir=tmp_path / "logs", max_bytes=500, backups=2)
    assert path == tmp_path / "logs" / "unit.log"
    log = logging.getLogger("sluice.test")
    for i in range(100):
        log.info("line %03d %s", i, "x" * 40)
    log.debug("not at INFO")
    files = sorted(p.name for p in path.parent.iterdir())
    assert files == ["unit.log", "unit.log.1", "unit.log.2"]  # the oldest went: backups bound the directory
    text = path.read_text()
    assert "line 099" in text and "not at INFO" not in text and all(p.stat().st_size <= 600 for p in path.parent.iterdir())


def test_configure_logging_refuses_what_it_cannot_use(tmp_path: Path, root_logging) -> None:
    with pytest.raises(InvalidParameterError, match="log level 'LOUD' is not one of DEBUG, INFO, WARNING, ERROR"):
        configure_logging("LOUD", name="x")
    (tmp_path / "file").write_text("")
    with pytest.raises(InvalidParameterError, match="cannot write logs in"):
        configure_logging("INFO", name="x", log_dir=tmp_path / "file" / "sub")


def _all_of(logs: Path) -> str:
    return "".join(p.read_text() for p in sorted(logs.iterdir()))


@pytest.mark.integration
def test_broker_logs_rotate_and_say_what_happened(tmp_path: Path) -> None:
    ns = SluiceProcess.start(["namesrv", "--log-level", "WARNING", "--log-dir", str(tmp_path / "nslogs")], tmp_path,
                             name="namesrv")
    try:
        config = 'log_dir = "logs"\nlog_max_bytes = 600\nlog_backups = 3\nlog_level = "DEBUG"\n'
        b = start_broker(tmp_path, ns.addr, "broker-a", config=config)
        logs = tmp_path / "logs"
        try:
            b.wait_for_stderr("listening on")
            first = _all_of(logs)
            assert "DEBUG" in first  # the TOML's level and directory
            assert "store " in first and ": clean shutdown, commit log ends at 0" in first
            assert "RecoveryReport(" not in first
            wait_for_route(ns.addr, "TBW102")  # listening is not registered yet: a send needs the route
            with Producer("LogsPG", ns.addr) as p:
                p.send(Message("LogsT", b"x"))
            wait_for(lambda: "topic LogsT auto-created on a send by 127.0.0.1:" in b.stderr(), 10, "creation line")
            wait_for_route(ns.addr, "LogsT")
            r = subprocess.run([sys.executable, "-m", "sluice", "admin", "deleteTopic", "-n", ns.addr, "-t", "LogsT",
                                "-c", "DefaultCluster"], capture_output=True, text=True, timeout=60)
            assert r.returncode == 0, r.stderr
            wait_for(lambda: "topic LogsT deleted by 127.0.0.1:" in b.stderr(), 10, "deletion line")
            # 600-byte files hold a few lines each: rotation keeps 3 old ones and drops the rest.
            def rotated_thrice() -> bool:
                with Producer("LogsPG2", ns.addr) as p2:  # each client's connection logs at DEBUG
                    p2.send(Message("LogsT2", b"y"))
                return (logs / "broker.log.3").exists()
            wait_for(rotated_thrice, 60, "broker.log.3", interval=0.2)
            assert {q.name for q in logs.iterdir()} == {"broker.log", "broker.log.1", "broker.log.2", "broker.log.3"}
            assert all(q.stat().st_size <= 600 + 400 for q in logs.iterdir())  # a file rotates before a line overflows it
            assert "deleted by" in _all_of(logs)
        finally:
            b.kill()
        b = start_broker(tmp_path, ns.addr, "broker-a", "--log-level", "INFO", config=config)  # the flag wins
        try:
            line = b.wait_for_stderr("listening on")
            opened = next(x for x in line.splitlines() if " open in " in x)
            assert "unclean shutdown, commit log scanned from" in opened and "DEBUG" not in b.stderr()
        finally:
            b.stop()
        assert " INFO " not in ns.stderr()  # the namesrv at WARNING
        assert (tmp_path / "nslogs" / "namesrv.log").exists()
    finally:
        ns.stop()


@pytest.mark.integration
def test_warning_level_broker_and_info_namesrv_log_dir(tmp_path: Path) -> None:
    ns = SluiceProcess.start(["namesrv", "--log-dir", str(tmp_path / "nslogs")], tmp_path, name="namesrv")
    try:
        b = start_broker(tmp_path, ns.addr, "broker-a", "--log-level", "WARNING")
        try:
            wait_for_route(ns.addr, "TBW102")  # listening is not registered yet: a send needs the route
            with Producer("WarnPG", ns.addr) as p:
                p.send(Message("WarnT", b"x"))
        finally:
            b.stop()
        assert " INFO " not in b.stderr() and "auto-created" not in b.stderr()
        text = wait_for(lambda: (t := (tmp_path / "nslogs" / "namesrv.log").read_text()) and "namesrv serving on" in t
                        and t, 10, "namesrv.log")
        assert " INFO " in text
    finally:
        ns.stop()


def test_the_recovery_report_reads_as_one_line() -> None:
    from sluice.store.recovery import RecoveryReport

    assert RecoveryReport(False, end_offset=4096, reput_from=4096).describe() == \
        "clean shutdown, commit log ends at 4096"
    rep = RecoveryReport(True, scanned_from=0, end_offset=1000, cut_bytes=37, tail_file="/s/commitlog-tails/x",
                         error="bad CRC at 1000", queues_truncated={"T/0": 2, "T/1": 1}, reput_from=800)
    line = rep.describe()
    assert line == ("unclean shutdown, commit log scanned from 0, ends at 1000; stopped at a bad record: bad CRC at "
                    "1000; 37 torn bytes cut (saved to /s/commitlog-tails/x); 3 consume-queue units that disagreed "
                    "with the log dropped in 2 queue(s); dispatch replays from 800 (200 bytes)")
    assert "\n" not in line


def test_topic_changes_are_logged_with_who_asked(tmp_path: Path, caplog) -> None:
    from sluice.broker.topics import TopicConfig, TopicConfigManager

    tm = TopicConfigManager(tmp_path)
    with caplog.at_level(logging.INFO, logger="sluice.broker.topics"):
        tm.update(TopicConfig("Made", 4, 4), by="10.0.0.1:5000")
        tm.update(TopicConfig("Made", 4, 4), by="10.0.0.1:5000")  # no change: no line
        tm.update(TopicConfig("Made", 2, 2))
        tm.get_or_create_for_send("Auto", None, 3, by="10.0.0.2:6000")
        tm.create_retry_or_dlq("%RETRY%G")
        tm.delete("Made", by="10.0.0.1:5000")
        tm.delete("Made", by="10.0.0.1:5000")  # gone already: no line
    lines = [r.getMessage() for r in caplog.records if r.name == "sluice.broker.topics"]
    assert lines == [
        "topic Made created by 10.0.0.1:5000: 4 write / 4 read queues, perm 6",
        "topic Made updated: 2 write / 2 read queues, perm 6 (was 4 write / 4 read queues, perm 6)",
        "topic Auto auto-created on a send by 10.0.0.2:6000 from TBW102: 3 write / 3 read queues, perm 6",
        "topic %RETRY%G auto-created: 1 write / 1 read queues, perm 6",
        "topic Made deleted by 10.0.0.1:5000",
    ]
    assert all(r.levelno == logging.INFO for r in caplog.records if r.name == "sluice.broker.topics")
