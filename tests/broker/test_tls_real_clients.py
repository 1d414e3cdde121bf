"""RocketMQ's own clients (librocketmq 1.0.1, ali-ons) have no TLS: a permissive cluster serves them in plain
beside the SDK over TLS on the same ports (the migration path docs/security.md describes)."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
from real_clients import CPP_PYTHON, REAL, needs_real_clients
from servers import running_cluster, wait_for_route
from tls_certs import Certs

from sluice import PullConsumer

pytestmark = [pytest.mark.slow, pytest.mark.integration, needs_real_clients]

TOPIC = "TopicTlsReal"


def run(argv: list[str], env: dict[str, str]) -> tuple[int, str]:
    done = subprocess.run(argv, cwd=REAL, env=env, capture_output=True, text=True, timeout=90)
    return done.returncode, (done.stdout + done.stderr)[-3000:]


def test_plain_real_clients_and_the_tls_sdk_share_a_permissive_cluster(tmp_path: Path) -> None:
    certs = Certs(tmp_path)
    mode = certs.server_args("permissive")
    with running_cluster(tmp_path, ("broker-a",), *mode, "--namesrv-tls", "--namesrv-tls-ca", certs.ca_file,
                         namesrv_extra=mode, client_tls=certs.client()) as c:
        home = tmp_path / "cpp-home"
        home.mkdir()
        cpp = [str(CPP_PYTHON), "cpp_client.py", "send", "--namesrv", c.ns, "--topic", TOPIC, "--group",
               "cpp_tls_producer", "--timeout", "40", "--send-timeout", "3",
               "--messages", json.dumps([{"body_b64": "ZnJvbS1jcHA=", "tags": "TagA"}])]  # from-cpp
        code, out = run(cpp, {**os.environ, "HOME": str(home), "PYTHONUNBUFFERED": "1"})
        assert code == 0, (out, c.broker.stderr()[-3000:])
        wait_for_route(c.ns, TOPIC, tls=certs.client())
        ons = [str(shutil.which("node")), "ons_client.js", "send", "--namesrv", c.ns, "--topic", TOPIC,
               "--group", "ons_tls_producer", "--timeout", "40",
               "--messages", json.dumps([{"body_b64": "ZnJvbS1vbnM=", "tags": "TagA"}])]  # from-ons
        code, out = run(ons, dict(os.environ))
        assert code == 0, (out, c.broker.stderr()[-3000:])
        got: list[bytes] = []
        with PullConsumer("CG_tls_real", c.ns, tls=True, tls_ca=certs.ca_file) as consumer:
            for mq in consumer.fetch_message_queues(TOPIC):
                got += [m.body for m in consumer.pull(mq, "*", 0, 32).msg_found_list]
        assert sorted(got) == [b"from-cpp", b"from-ons"]
        assert "refusing plain" not in c.broker.stderr()
