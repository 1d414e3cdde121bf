"""The real-client driver programs themselves: they must fail cleanly and in bounded time.

No Sluice server is needed here. A dead address must give exit status 2 and a clear message at
once; a peer that accepts connections but never answers must still end within the program's
--timeout (plus its watchdog grace) with a non-zero status, never hang a test run.
"""
from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import threading
import time
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
CPP_PYTHON = ROOT / ".venv-cpp" / "bin" / "python"
MESSAGES = json.dumps([{"tags": "TagA", "keys": ["k"], "props": {"a": "1"}, "body_b64": "aGk="}])

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def installed() -> None:
    done = subprocess.run(["bash", str(ROOT / "scripts" / "bootstrap_clients.sh")], cwd=ROOT,
                          capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, f"bootstrap_clients.sh failed:\n{done.stdout}\n{done.stderr}"


def commands(addr: str, timeout: float) -> dict[str, list[str]]:
    node = shutil.which("node") or "node"
    cpp = [str(CPP_PYTHON), str(HERE / "cpp_client.py")]
    ons = [node, str(HERE / "ons_client.js")]
    common = ["--namesrv", addr, "--topic", "T", "--group", "G", "--timeout", str(timeout)]
    return {
        "cpp-send": cpp + ["send", *common, "--messages", MESSAGES, "--send-timeout", "2"],
        "cpp-push": cpp + ["push", *common, "--expect", "1", "--settle", "0.5"],
        "cpp-pull": cpp + ["pull", *common, "--expect", "1"],
        "ons-send": ons + ["send", *common, "--messages", MESSAGES],
        "ons-push": ons + ["push", *common, "--expression", "*", "--expect", "1"],
    }


def run_all(cmds: dict[str, list[str]], tmp_path: Path, limit: float) -> dict[str, tuple[int, list[dict], str]]:
    """Run every program at once (they are independent) and collect exit status, JSON lines, stderr."""
    env = {**os.environ, "HOME": str(tmp_path)}  # librocketmq logs under $HOME
    procs = {name: subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                    env=env, start_new_session=True) for name, argv in cmds.items()}
    results = {}
    for name, proc in procs.items():
        try:
            out, err = proc.communicate(timeout=limit)
        except subprocess.TimeoutExpired:
            for p in procs.values():
                if p.poll() is None:
                    os.killpg(p.pid, 9)  # our own children's sessions, by pid
                    p.wait(10)
            pytest.fail(f"{name} was still running after {limit:g} s")
        lines = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
        results[name] = (proc.returncode, lines, err)
    return results


def test_nothing_listening_fails_at_once_with_a_clear_message(installed: None, tmp_path: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again below: nothing listens there
    started = time.monotonic()
    results = run_all(commands(f"127.0.0.1:{port}", 10.0), tmp_path, limit=30.0)
    assert time.monotonic() - started < 20.0
    for name, (rc, lines, err) in results.items():
        assert rc == 2, f"{name}: exit {rc}\n{lines}\n{err}"
        assert lines and lines[-1]["event"] == "summary" and lines[-1]["ok"] is False, (name, lines)
        assert f"127.0.0.1:{port} not reachable" in lines[-1]["error"], (name, lines)


@pytest.mark.slow
def test_silent_peer_ends_within_the_timeout(installed: None, tmp_path: Path) -> None:
    # Accepts connections and reads, but never answers: every client must give up on its own.
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(64)
    conns: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        listener.settimeout(0.2)
        while not stop.is_set():
            try:
                conns.append(listener.accept()[0])
            except OSError:
                continue

    acceptor = threading.Thread(target=accept, daemon=True)
    acceptor.start()
    try:
        timeout = 5.0
        started = time.monotonic()
        results = run_all(commands(f"127.0.0.1:{listener.getsockname()[1]}", timeout), tmp_path,
                          limit=timeout + 30.0)
        assert time.monotonic() - started < timeout + 25.0
    finally:
        stop.set()
        acceptor.join(5)
        for c in conns:
            c.close()
        listener.close()
    for name, (rc, lines, err) in results.items():
        assert rc not in (0, None), f"{name}: exit {rc}\n{lines}\n{err}"
        assert rc > 0, f"{name} crashed with signal {-rc}\n{lines}\n{err}"
        assert lines and lines[-1]["event"] == "summary" and lines[-1]["ok"] is False, (name, lines, err)


def test_bad_usage_exits_2(installed: None) -> None:
    cpp = subprocess.run([str(CPP_PYTHON), str(HERE / "cpp_client.py"), "send", "--topic", "T"],
                         capture_output=True, text=True, timeout=30)
    assert cpp.returncode == 2 and "--namesrv" in cpp.stderr
    ons = subprocess.run([shutil.which("node") or "node", str(HERE / "ons_client.js"), "push", "--topic", "T"],
                         capture_output=True, text=True, timeout=30)
    assert ons.returncode == 2 and "--namesrv is required" in ons.stdout
    bad = subprocess.run([str(CPP_PYTHON), str(HERE / "cpp_client.py"), "send", "--namesrv", "127.0.0.1:1",
                          "--topic", "T", "--group", "G", "--messages", "{not json"],
                         capture_output=True, text=True, timeout=30)
    assert bad.returncode == 2 and "bad --messages" in bad.stdout, bad.stdout
