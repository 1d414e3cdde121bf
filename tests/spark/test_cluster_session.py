"""Cluster traps of issue 13, each through real processes: a user's own SparkSession plus register(),
the master chosen by spark-submit or the environment, the UI left on, spark-submit from the venv
without the venv on PATH."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import orjson
import pytest

from sluice.spark.builder import DEFAULT_MASTER, chosen_master, spark_home
from sluice.store import MessageStore, StoreConfig, StoreMessage

VENV_BIN = Path(sys.executable).parent
SPARK_VARS = ("PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON", "SPARK_HOME", "MASTER", "PYSPARK_SUBMIT_ARGS",
              "PYSPARK_GATEWAY_PORT", "PYSPARK_GATEWAY_SECRET", "SPARK_CONF_DIR", "SPARK_ENV_LOADED")


def bare_env(**extra: str) -> dict[str, str]:
    """The environment of a user whose shell has not activated the venv and set no Spark variable."""
    env = {k: v for k, v in os.environ.items() if k not in SPARK_VARS and k != "VIRTUAL_ENV"}
    env["PATH"] = os.pathsep.join(p for p in env.get("PATH", "").split(os.pathsep)
                                  if p and Path(p).resolve() != VENV_BIN.resolve())
    env.update(extra)
    return env


def make_store(root: Path, n: int = 40) -> Path:
    with MessageStore(root, StoreConfig(commitlog_file_size=1 << 20, max_message_size=64 * 1024)) as st:
        st.put_messages([StoreMessage("T", f"m{i}".encode(), properties={"TAGS": "A" if i % 2 else "B"})
                         for i in range(n)])
        st.wait_dispatched()
    return root


def run_job(tmp: Path, source: str, argv: list[str], env: dict[str, str], timeout: float = 240) -> dict:
    """Run ``source`` (a job printing one JSON line starting RESULT) by ``argv`` + its path; its result."""
    job = tmp / "job.py"
    job.write_text(textwrap.dedent(source))
    r = subprocess.run([*argv, str(job)], capture_output=True, text=True, timeout=timeout, env=env, cwd=tmp)
    lines = [ln for ln in r.stdout.splitlines() if ln.startswith("RESULT ")]
    assert r.returncode == 0 and lines, f"rc={r.returncode}\n{r.stdout[-1500:]}\n{r.stderr[-3000:]}"
    return orjson.loads(lines[-1][len("RESULT "):])


# ---------------------------------------------------------------- which master session() picks (no JVM)

@pytest.mark.parametrize("arg, conf, env, expected", [
    (None, {}, {}, (DEFAULT_MASTER, DEFAULT_MASTER)),
    ("local[1]", {}, {"MASTER": "local[3]"}, ("local[1]", "local[1]")),            # the argument wins
    (None, {"spark.master": "local[2]"}, {"MASTER": "local[3]"}, (None, "local[2]")),
    (None, {}, {"MASTER": "spark://h:7077"}, (None, "spark://h:7077")),
    (None, {}, {"PYSPARK_SUBMIT_ARGS": "--master 'local[2]' pyspark-shell"}, (None, "local[2]")),
    (None, {}, {"PYSPARK_SUBMIT_ARGS": "--master=yarn pyspark-shell", "MASTER": "local[3]"}, (None, "yarn")),
])
def test_chosen_master_respects_what_was_set_outside(monkeypatch, tmp_path, arg, conf, env, expected):
    for k in SPARK_VARS:
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("SPARK_CONF_DIR", str(tmp_path))  # no spark-defaults.conf there
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    assert chosen_master(arg, conf) == expected


def test_chosen_master_reads_spark_defaults_conf(monkeypatch, tmp_path):
    for k in SPARK_VARS:
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("SPARK_CONF_DIR", str(tmp_path))
    (tmp_path / "spark-defaults.conf").write_text("# cluster\nspark.executor.memory 2g\nspark.master   spark://m:7077\n")
    assert chosen_master() == (None, "spark://m:7077")
    monkeypatch.setenv("MASTER", "local[3]")  # spark-submit: the properties file before $MASTER
    assert chosen_master() == (None, "spark://m:7077")
    monkeypatch.setenv("PYSPARK_SUBMIT_ARGS", "--master local[2] pyspark-shell")
    assert chosen_master() == (None, "local[2]")


# ---------------------------------------------------------------- real sessions in subprocesses

OWN_SESSION_JOB = """
import json, sys
from pyspark.sql import SparkSession
spark = (SparkSession.builder.master("local[1]").config("spark.driver.bindAddress", "127.0.0.1")
         .config("spark.driver.host", "127.0.0.1").getOrCreate())
before = spark.conf.get("spark.sql.python.filterPushdown.enabled")
from sluice.spark import register
register(spark)
df = spark.read.format("sluice_store").load(sys.argv[1] if len(sys.argv) > 1 else {store!r})
n = df.where("tags = 'A'").count()
print("RESULT " + json.dumps({{"before": before, "count": n, "python": spark.sparkContext.pythonExec}}))
spark.stop()
"""


@pytest.mark.spark
@pytest.mark.slow
def test_register_on_a_users_own_session(tmp_path):
    """Issue 13: a user's own SparkSession plus register() failed every read (DATA_SOURCE_PUSHDOWN_DISABLED),
    and its workers ran `python3` from PATH."""
    store = make_store(tmp_path / "store")
    got = run_job(tmp_path, OWN_SESSION_JOB.format(store=str(store)), [sys.executable], bare_env())
    assert got["before"] == "false"  # Spark's default: what register() has to change
    assert got["count"] == 20
    assert got["python"] == "python3"  # the user's context is left as they built it


MASTER_JOB = """
import json
from sluice.spark import session
spark = session(app_name="master-probe")
sc = spark.sparkContext
n = spark.read.format("sluice_store").load({store!r}).count()
print("RESULT " + json.dumps({{"master": sc.master, "ui": sc.uiWebUrl, "count": n}}))
spark.stop()
"""


@pytest.mark.spark
@pytest.mark.slow
def test_session_takes_the_master_from_the_environment_and_keeps_the_ui(tmp_path):
    store = make_store(tmp_path / "store")
    got = run_job(tmp_path, MASTER_JOB.format(store=str(store)), [sys.executable], bare_env(MASTER="local[1]"))
    assert got["master"] == "local[1]"  # not session()'s default local[*]
    assert got["ui"] and got["ui"].startswith("http://")  # the UI stays on unless asked
    assert got["count"] == 40


@pytest.mark.spark
@pytest.mark.slow
def test_sluice_spark_submit_without_the_venv_on_path(tmp_path):
    """`sluice spark submit` is spark-submit with this venv's PySpark and Python: spark-submit's --master
    reaches session(), and the job's workers import sluice."""
    store = make_store(tmp_path / "store")
    sluice = str(VENV_BIN / "sluice")
    got = run_job(tmp_path, MASTER_JOB.format(store=str(store)), [sluice, "spark", "submit", "--master", "local[1]"],
                  bare_env())
    assert got["master"] == "local[1]" and got["count"] == 40


@pytest.mark.spark
@pytest.mark.slow
def test_venv_spark_submit_with_the_documented_environment(tmp_path):
    """`.venv/bin/spark-submit` fails without the venv on PATH (pip's find-spark-home asks `python3` from
    PATH for SPARK_HOME, and the driver and workers run that `python3`); with SPARK_HOME and PYSPARK_PYTHON
    set as docs/spark.md gives them, it runs."""
    store = make_store(tmp_path / "store")
    env = bare_env(SPARK_HOME=spark_home(), PYSPARK_PYTHON=sys.executable)
    got = run_job(tmp_path, MASTER_JOB.format(store=str(store)), [str(VENV_BIN / "spark-submit"), "--master",
                                                                   "local[1]"], env)
    assert got["master"] == "local[1]" and got["count"] == 40
