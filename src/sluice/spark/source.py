"""``format("sluice")``: topics through the broker as DataFrames (batch, streaming) and back (writing).

Everything that talks to the broker runs where Spark calls it: planning
(queues, offsets) in the driver's planner process, pulls and sends in the
executors; no connection is kept on an object Spark pickles. The parts:
``options`` (the options, checked), ``broker_io`` (routes, offsets and pulls with no
consumer group), ``pushdown``, ``reader`` (batch), ``stream`` (micro-batches),
``writer`` (the sink). See docs/spark.md for the options, the columns and the
pushdown rules.
"""
from __future__ import annotations

from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    DataSourceStreamWriter,
    DataSourceWriter,
)

from sluice.errors import InvalidParameterError
from sluice.spark.options import READ_OPTIONS, Options, short_errors, warn_unknown
from sluice.spark.pushdown import Pushdown
from sluice.spark.reader import QueueRange, RangePartition, SluiceBatchReader, read_range, resolve, split_ranges
from sluice.spark.storefiles import SCHEMA_DDL
from sluice.spark.stream import SluiceStreamReader, fair_limit
from sluice.spark.writer import SentCount, SluiceBatchWriter, SluiceStreamWriter, _unique_key

__all__ = ["Options", "Pushdown", "QueueRange", "RangePartition", "SentCount", "SluiceBatchReader",
           "SluiceBatchWriter", "SluiceDataSource", "SluiceStreamReader", "SluiceStreamWriter", "_unique_key",
           "fair_limit", "read_range", "resolve", "split_ranges"]


class SluiceDataSource(DataSource):
    @classmethod
    def name(cls) -> str:
        return "sluice"

    @short_errors
    def schema(self) -> str:
        # Called at load(): bad read options fail here, in a short error raised before any query runs
        # (from reader() they would surface inside a long AnalysisException at the first action).
        warn_unknown(self.options, READ_OPTIONS, "reading")
        Options(self.options)
        return SCHEMA_DDL

    @short_errors
    def reader(self, schema) -> DataSourceReader:
        return SluiceBatchReader(self.options)

    @short_errors
    def streamReader(self, schema) -> DataSourceStreamReader:
        return SluiceStreamReader(self.options)

    @short_errors
    def writer(self, schema, overwrite: bool) -> DataSourceWriter:
        if overwrite:
            raise InvalidParameterError("format('sluice') cannot overwrite a topic (messages are only appended): "
                                        "use mode('append'), as with Kafka's sink")
        return SluiceBatchWriter(self.options, schema)

    @short_errors
    def streamWriter(self, schema, overwrite: bool) -> DataSourceStreamWriter:
        if overwrite:
            raise InvalidParameterError("format('sluice') cannot overwrite a topic: use outputMode('append')")
        return SluiceStreamWriter(self.options, schema)
