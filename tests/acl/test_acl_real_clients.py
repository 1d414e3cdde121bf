"""The real clients (librocketmq's set_session_credentials, ali-ons' accessKey/secretKey) against an ACL broker."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
from real_clients import CPP_PYTHON, REAL, needs_real_clients
from servers import running_cluster, wait_for_route

pytestmark = [pytest.mark.slow, pytest.mark.integration, needs_real_clients]

ACL = """\
accounts:
  - accessKey: realuser
    secretKey: real-secret-1
    defaultTopicPerm: DENY
    defaultGroupPerm: SUB
    topicPerms:
      - TopicReal=PUB|SUB
"""
MESSAGES = json.dumps([{"body_b64": "aGVsbG8=", "tags": "TagA"}])


def run(argv: list[str], tmp: Path, env: dict[str, str]) -> tuple[int, list[dict], str]:
    done = subprocess.run(argv, cwd=REAL, env=env, capture_output=True, text=True, timeout=90)
    events = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    return done.returncode, events, done.stderr[-3000:]


def cpp_send(tmp: Path, ns: str, *creds: str) -> tuple[int, list[dict], str]:
    argv = [str(CPP_PYTHON), "cpp_client.py", "send", "--namesrv", ns, "--topic", "TopicReal", "--group",
            "cpp_acl_producer", "--timeout", "40", "--send-timeout", "3", "--messages", MESSAGES]
    if creds:
        argv += ["--access-key", creds[0], "--secret-key", creds[1]]
    home = tmp / "cpp-home"
    home.mkdir(exist_ok=True)
    return run(argv, tmp, {**os.environ, "HOME": str(home), "PYTHONUNBUFFERED": "1"})


def ons_send(tmp: Path, ns: str, ak: str, sk: str) -> tuple[int, list[dict], str]:
    argv = [str(shutil.which("node")), "ons_client.js", "send", "--namesrv", ns, "--topic", "TopicReal",
            "--group", "ons_acl_producer", "--timeout", "40", "--messages", MESSAGES,
            "--access-key", ak, "--secret-key", sk]
    return run(argv, tmp, dict(os.environ))


def test_real_clients_sign_and_are_checked(tmp_path: Path) -> None:
    (tmp_path / "plain_acl.yml").write_text(ACL)
    with running_cluster(tmp_path, ("broker-a",), "--acl", str(tmp_path / "plain_acl.yml")) as c:
        code, events, err = cpp_send(tmp_path, c.ns, "realuser", "real-secret-1")
        assert code == 0, (events, err, c.broker.stderr_path.read_text()[-3000:])
        wait_for_route(c.ns, "TopicReal")
        code, events, err = ons_send(tmp_path, c.ns, "realuser", "real-secret-1")
        assert code == 0, (events, err, c.broker.stderr_path.read_text()[-3000:])
        # Wrong secrets are refused, for both.
        code, events, _ = cpp_send(tmp_path, c.ns, "realuser", "not-the-secret")
        assert code != 0
        code, events, _ = ons_send(tmp_path, c.ns, "realuser", "not-the-secret")
        assert code != 0
        log = c.broker.stderr_path.read_text()
        assert "Check signature failed for accessKey=realuser" in log
