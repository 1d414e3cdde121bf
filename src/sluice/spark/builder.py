"""A SparkSession with the settings Sluice's data sources need, and their registration.

Each setting answers a trap measured with PySpark 4.3 (docs/spark.md):
workers must run this interpreter (they import sluice and pyarrow), Python
filter pushdown is off by default and then fails every read of a source that
implements ``pushFilters``, and the driver would bind the machine's public
address.
"""
from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sluice.persist import write_atomic

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

#: Settings every Sluice session gets (overridable through ``session(**conf)``).
BASE_CONF: dict[str, str] = {
    "spark.sql.python.filterPushdown.enabled": "true",
    "spark.ui.enabled": "false",
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
rootLogger.level = error
rootLogger.appenderRef.stderr.ref = console
appender.console.type = Console
appender.console.name = console
appender.console.target = SYSTEM_ERR
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = %d{HH:mm:ss} %p %c{1}: %m%n
logger.repl.name = org.apache.spark.repl.Main
logger.repl.level = error
logger.gateway.name = org.apache.spark.api.python.PythonGatewayServer
logger.gateway.level = error
"""


def _log4j2_file() -> str:
    path = Path(tempfile.gettempdir()) / f"sluice-spark-log4j2-{os.getuid()}.properties"
    if not path.exists() or path.read_text() != _LOG4J2:
        write_atomic(path, _LOG4J2.encode())
    return str(path)


def session(master: str = "local[*]", app_name: str = "sluice", **conf: Any) -> SparkSession:
    """Build (or get) a SparkSession ready for ``format("sluice")`` and the store jobs, registered.

    ``conf`` keys are Spark settings with dots written as is (pass a dict: ``**{"spark.executor.memory": "2g"}``).
    On a cluster (``master`` not ``local``) the executors must have sluice installed (docs/spark.md).
    """
    # Workers start `python3` from PATH unless told: they need this venv (sluice, pyarrow).
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    local = master.startswith("local")
    if local:
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.master(master).appName(app_name)
    java = f"-Dlog4j2.configurationFile={_log4j2_file()}" + (f" {_LOCAL_JAVA_OPTIONS}" if local else "")
    settings = {**BASE_CONF, **(LOCAL_CONF if local else {}), "spark.driver.extraJavaOptions": java,
                **{k: str(v) for k, v in conf.items()}}
    for key, value in settings.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    register(spark)
    return spark


def register(spark: SparkSession) -> None:
    """Register the ``sluice`` (topics through a broker) and ``sluice_store`` (store files) sources."""
    from sluice.spark.source import SluiceDataSource
    from sluice.spark.store_source import SluiceStoreDataSource

    spark.dataSource.register(SluiceDataSource)
    spark.dataSource.register(SluiceStoreDataSource)
