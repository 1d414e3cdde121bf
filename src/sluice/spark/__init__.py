"""Sluice's data pipeline on Apache Spark (PySpark; install the ``spark`` extra).

* ``session()`` / ``register(spark)``: a SparkSession with the needed settings; the
  ``sluice`` (topics through a broker) and ``sluice_store`` (store files) sources.
* ``selector_column(expr)``: a SQL92 or TAG selector as a Spark Column, the broker's outcomes.
* ``SluiceDataSource``: the ``sluice`` source itself (``spark.dataSource.register(SluiceDataSource)``).
* ``scan`` / ``stats``: bulk jobs over a store's files (sluice.spark.jobs).
* ``demo_job``: the README's closing job.

See docs/spark.md.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from sluice.spark.builder import register, session
    from sluice.spark.demo import demo_job
    from sluice.spark.jobs import scan, stats
    from sluice.spark.selector import selector_column
    from sluice.spark.source import SluiceDataSource

__all__ = ["SluiceDataSource", "demo_job", "register", "scan", "selector_column", "session", "stats"]


def __getattr__(name: str) -> Any:
    # Lazy: `import sluice.spark` must not start importing pyspark (the CLI imports it for --help).
    if name in ("session", "register"):
        from sluice.spark import builder as _s

        return getattr(_s, name)
    if name == "selector_column":
        from sluice.spark.selector import selector_column

        return selector_column
    if name == "SluiceDataSource":
        from sluice.spark.source import SluiceDataSource

        return SluiceDataSource
    if name in ("scan", "stats"):
        from sluice.spark import jobs

        return getattr(jobs, name)
    if name == "demo_job":
        from sluice.spark.demo import demo_job

        return demo_job
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
