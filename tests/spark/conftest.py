"""One SparkSession (local[2]) for every Spark test: starting one costs 6-13 s here."""
from __future__ import annotations

import shutil

import pytest

pyspark = pytest.importorskip("pyspark", reason="the spark extra is not installed")
if shutil.which("java") is None:  # the machine image provides Java 17; Spark cannot run without one
    pytest.skip("no java on PATH (Spark 4 needs Java 17 or 21)", allow_module_level=True)


@pytest.fixture(scope="session")
def spark():
    from sluice.spark import session

    s = session("local[2]", app_name="sluice-tests", ui=False, **{"spark.sql.shuffle.partitions": "2",
                                                          "spark.default.parallelism": "2",
                                                          "spark.driver.memory": "1g"})
    yield s
    for q in s.streams.active:
        q.stop()
    s.stop()
