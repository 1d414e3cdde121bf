"""A SparkSession with the settings Sluice's data sources need, and their registration.

Each setting answers a trap measured with PySpark 4.3 (docs/spark.md):
workers must run an interpreter that imports sluice and pyarrow, Python
filter pushdown is off by default and then fails every read of a source that
implements ``pushFilters``, and a local driver would bind the machine's public
address. A master chosen outside the program (spark-submit's ``--master``,
``MASTER``, ``PYSPARK_SUBMIT_ARGS``, ``spark.master`` in ``conf``) is respected.
"""
from __future__ import annotations

import logging
import os
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sluice.errors import InvalidParameterError
from sluice.persist import write_atomic

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger(__name__)

#: The setting without which every read of a source implementing ``pushFilters`` fails
#: (DATA_SOURCE_PUSHDOWN_DISABLED); a runtime SQL setting, so register() sets it on any session.
PUSHDOWN_SETTING = "spark.sql.python.filterPushdown.enabled"
#: The master when nothing (argument, conf, spark-submit, environment) names one.
DEFAULT_MASTER = "local[*]"
#: Settings every Sluice session gets (overridable through ``session(**conf)``). Spark's console
#: progress bar is off: the CLI draws its own (sluice.spark.progress) and the bar garbles piped output.
BASE_CONF: dict[str, str] = {
    PUSHDOWN_SETTING: "true",
    "spark.ui.showConsoleProgress": "false",
}
#: Extra settings for an embedded (local[...]) session: small shuffles, loopback only, a C1 JIT
#: (the JVM start and first jobs dominate small jobs on a 2-core machine).
LOCAL_CONF: dict[str, str] = {
    "spark.sql.shuffle.partitions": "4",
    "spark.sql.adaptive.enabled": "false",
    "spark.driver.bindAddress": "127.0.0.1",
    "spark.driver.host": "127.0.0.1",
}
_LOCAL_JAVA_OPTIONS = "-XX:+UseSerialGC -XX:TieredStopAtLevel=1"

# Spark's default log4j profile prints a banner and WARN lines into the output of every command
# (`sluice demo`, `sluice spark ...`); errors still reach stderr, and the job's own errors are raised.
# The repl logger at the root's level stops the "Setting default log level" notice of a Python driver.
_LOG4J2 = """\
rootLogger.level = {level}
rootLogger.appenderRef.stderr.ref = console
appender.console.type = Console
appender.console.name = console
appender.console.target = SYSTEM_ERR
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = %d{HH:mm:ss} %p %c{1}: %m%n
logger.repl.name = org.apache.spark.repl.Main
logger.repl.level = {level}
logger.gateway.name = org.apache.spark.api.python.PythonGatewayServer
logger.gateway.level = {level}
"""


#: Levels ``session(log_level=...)`` takes (log4j's names).
LOG_LEVELS = ("off", "fatal", "error", "warn", "info", "debug")


def _log4j2_file(level: str = "error") -> str:
    if level not in LOG_LEVELS:
        raise InvalidParameterError(f"log_level must be one of {', '.join(LOG_LEVELS)}, not {level!r}")
    text = _LOG4J2.replace("{level}", level)
    path = Path(tempfile.gettempdir()) / f"sluice-spark-log4j2-{os.getuid()}-{level}.properties"
    if not path.exists() or path.read_text() != text:
        write_atomic(path, text.encode())
    return str(path)


def spark_home() -> str:
    """The Spark installation pip's PySpark carries (its jars/ and bin/spark-class)."""
    import pyspark

    return str(Path(pyspark.__file__).parent)


def submit_env(env: dict[str, str] | None = None) -> dict[str, str]:
    """``env`` (default os.environ) plus what pip's spark-submit/spark-class need to run from this venv
    when the venv is not on PATH: SPARK_HOME (pip's find-spark-home asks ``python3`` from PATH, which
    cannot import pyspark) and PYSPARK_PYTHON/PYSPARK_DRIVER_PYTHON (the driver and the workers start
    ``python3`` from PATH otherwise, which cannot import sluice). Values already set are kept."""
    out = dict(os.environ if env is None else env)
    out.setdefault("SPARK_HOME", spark_home())
    out.setdefault("PYSPARK_PYTHON", sys.executable)
    out.setdefault("PYSPARK_DRIVER_PYTHON", out["PYSPARK_PYTHON"])
    return out


def _submit_args_master(args: str) -> str | None:
    try:
        words = shlex.split(args)
    except ValueError:
        return None
    for i, w in enumerate(words):
        if w == "--master" and i + 1 < len(words):
            return words[i + 1]
        if w.startswith("--master="):
            return w.partition("=")[2]
    return None


def _defaults_master() -> str | None:
    """``spark.master`` of spark-defaults.conf (in $SPARK_CONF_DIR, else $SPARK_HOME/conf), as spark-submit reads it."""
    conf_dir = os.environ.get("SPARK_CONF_DIR") or os.path.join(os.environ.get("SPARK_HOME") or spark_home(), "conf")
    path = Path(conf_dir) / "spark-defaults.conf"
    if not path.is_file():
        return None
    for line in path.read_text(errors="replace").splitlines():
        key, _, value = line.strip().replace("=", " ", 1).partition(" ")
        if key == "spark.master" and value.strip():
            return value.strip()
    return None


def chosen_master(master: str | None = None, conf: dict[str, Any] | None = None) -> tuple[str | None, str]:
    """(the master session() must set, or None to leave Spark's own choice; the master the session gets).

    Order, as spark-submit decides it: the ``master`` argument, ``spark.master`` in ``conf``, the master
    of a driver launched by spark-submit (its JVM is already running), ``--master`` in
    ``PYSPARK_SUBMIT_ARGS``, ``spark.master`` in spark-defaults.conf, ``MASTER``; else local[*]."""
    if master:
        return master, master
    conf = conf or {}
    if conf.get("spark.master"):
        return None, str(conf["spark.master"])
    if os.environ.get("PYSPARK_GATEWAY_PORT"):  # a driver started by spark-submit: ask its JVM
        from pyspark import SparkConf, SparkContext

        SparkContext._ensure_initialized()
        found = SparkConf().get("spark.master", None)
        if found:
            return None, found
    found = (_submit_args_master(os.environ.get("PYSPARK_SUBMIT_ARGS", "")) or _defaults_master()
             or os.environ.get("MASTER"))
    if found:
        return None, found
    return DEFAULT_MASTER, DEFAULT_MASTER


def session(master: str | None = None, app_name: str = "sluice", *, ui: bool = True, log_level: str = "error",
            **conf: Any) -> SparkSession:
    """Build (or get) a SparkSession ready for ``format("sluice")`` and the store jobs, registered.

    ``master``: None respects a master chosen outside the program (spark-submit's ``--master``,
    ``spark.master`` in ``conf``, ``PYSPARK_SUBMIT_ARGS``, ``MASTER``), else local[*]. ``ui=False``
    turns Spark's web UI off (it stays on by default, clusters included). ``log_level`` is the JVM's log
    level (LOG_LEVELS; "off" leaves errors to the exceptions the job raises). ``conf`` keys are Spark
    settings with dots written as is (pass a dict: ``**{"spark.executor.memory": "2g"}``).
    On a cluster (``master`` not ``local``) the executors must have sluice installed (docs/spark.md).
    """
    to_set, effective = chosen_master(master, conf)
    # Workers start `python3` from PATH unless told: they need an interpreter with sluice and pyarrow.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    local = effective.startswith("local")
    if local:
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.appName(app_name)
    if to_set:
        builder = builder.master(to_set)
    java = f"-Dlog4j2.configurationFile={_log4j2_file(log_level)}" + (f" {_LOCAL_JAVA_OPTIONS}" if local else "")
    settings = {**BASE_CONF, **(LOCAL_CONF if local else {}), "spark.driver.extraJavaOptions": java,
                **({} if ui else {"spark.ui.enabled": "false"}), **{k: str(v) for k, v in conf.items()}}
    for key, value in settings.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel(log_level.upper())
    register(spark)
    return spark


def _imports_sluice(python: str) -> bool:
    """Whether ``python`` (a name on PATH or a path) imports sluice and pyarrow, as the data sources need."""
    try:
        r = subprocess.run([python, "-c", "import sluice.spark.storefiles"], capture_output=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return r.returncode == 0


def register(spark: SparkSession) -> None:
    """Register the ``sluice`` (topics through a broker) and ``sluice_store`` (store files) sources on
    ``spark``, any session (``session()``'s or one built by hand), setting what they need:

    * ``spark.sql.python.filterPushdown.enabled=true`` (a runtime setting; without it every read fails
      with DATA_SOURCE_PUSHDOWN_DISABLED). Refused with InvalidParameterError naming the setting if the
      session will not take it.
    * For a local master whose worker Python (``PYSPARK_PYTHON``, default ``python3`` from PATH) cannot
      import sluice: the sources' Python processes run this interpreter instead (one log line).
    """
    from sluice.spark.source import SluiceDataSource
    from sluice.spark.store_source import SluiceStoreDataSource

    try:
        spark.conf.set(PUSHDOWN_SETTING, "true")
    except Exception as e:  # noqa: BLE001 - py4j/analysis errors of other Spark builds
        raise InvalidParameterError(f"Sluice's sources need {PUSHDOWN_SETTING}=true and this session refused "
                                    f"it ({type(e).__name__}); build the session with "
                                    f".config({PUSHDOWN_SETTING!r}, 'true')") from None
    if spark.conf.get(PUSHDOWN_SETTING).lower() != "true":
        raise InvalidParameterError(f"Sluice's sources need {PUSHDOWN_SETTING}=true; this session keeps it "
                                    f"{spark.conf.get(PUSHDOWN_SETTING)!r}")
    sc = spark.sparkContext
    python = sc.pythonExec
    swap = (sc.master.startswith("local") and python != sys.executable and not _imports_sluice(python))
    if swap:
        log.info("worker Python %r cannot import sluice: Sluice's sources run %s (set PYSPARK_PYTHON to choose)",
                 python, sys.executable)
        sc.pythonExec = sys.executable
    try:
        # The serialized sources carry the interpreter their planner and reader processes run.
        spark.dataSource.register(SluiceDataSource)
        spark.dataSource.register(SluiceStoreDataSource)
    finally:
        sc.pythonExec = python
