"""``format("sluice_store")``: a Python data source over a store's files (scan jobs; no broker needed).

Options: ``path`` (the store directory, absolute; ``.load(path)`` works), ``topic`` (one topic or a comma list;
default every topic), ``splitBytes`` (target bytes per task, default 64 MiB), ``checkCrc`` (default
true: a damaged record fails the task with its file and offset), ``broker`` (value of the broker
column). A ``where`` on ``topic`` or ``tags`` (= or IN) is pushed into the reader, which then skips
other records before copying their bodies; everything else stays in Spark.
"""
from __future__ import annotations

from collections.abc import Iterator, Sequence

from pyspark.sql.datasource import DataSource, DataSourceReader, EqualTo, Filter, In, InputPartition

from sluice.errors import InvalidParameterError
from sluice.spark.storefiles import SCHEMA_DDL, SegmentReader, Split, check_store_path, plan_splits


class StoreSplit(InputPartition):
    def __init__(self, split: Split) -> None:
        super().__init__((split.path, split.start, split.end))
        self.split = split


def _flag(options, name: str, default: bool) -> bool:
    raw = options.get(name)
    if raw is None:
        return default
    if str(raw).lower() not in ("true", "false"):
        raise InvalidParameterError(f"option {name} must be true or false, not {raw!r}")
    return str(raw).lower() == "true"


def _string_set(f: Filter) -> frozenset[str] | None:
    """The values of ``col = 's'`` or ``col IN ('s', ...)``; None for any other filter."""
    if isinstance(f, EqualTo) and isinstance(f.value, str):
        return frozenset([f.value])
    if isinstance(f, In) and f.value and all(isinstance(v, str) for v in f.value):
        return frozenset(f.value)
    return None


class SluiceStoreReader(DataSourceReader):
    def __init__(self, options) -> None:
        self.path = options.get("path")
        if not self.path:
            raise InvalidParameterError("format('sluice_store') needs the store directory: .load(path)")
        check_store_path(self.path)
        topic = options.get("topic")
        self.topics = frozenset(t.strip() for t in topic.split(",") if t.strip()) if topic else None
        try:
            self.split_bytes = int(options.get("splitBytes", 64 * 1024 * 1024))
        except ValueError:
            raise InvalidParameterError(f"splitBytes must be an integer, not {options.get('splitBytes')!r}") from None
        self.check_crc = _flag(options, "checkCrc", True)
        self.broker = options.get("broker")
        self.tags: frozenset[str] | None = None

    def pushFilters(self, filters: list[Filter]) -> Iterator[Filter]:
        for f in filters:
            wanted = _string_set(f)
            if wanted is not None and f.attribute == ("topic",):
                self.topics = wanted if self.topics is None else self.topics & wanted
            elif wanted is not None and f.attribute == ("tags",):
                self.tags = wanted if self.tags is None else self.tags & wanted
            else:
                yield f

    def partitions(self) -> Sequence[InputPartition]:
        return [StoreSplit(s) for s in plan_splits(self.path, self.split_bytes)]

    def read(self, partition: StoreSplit):
        if (self.topics is not None and not self.topics) or (self.tags is not None and not self.tags):
            return
        yield from SegmentReader(partition.split, topics=self.topics, tags=self.tags, broker=self.broker,
                                 check_crc=self.check_crc).batches()


class SluiceStoreDataSource(DataSource):
    @classmethod
    def name(cls) -> str:
        return "sluice_store"

    def schema(self) -> str:
        return SCHEMA_DDL

    def reader(self, schema) -> DataSourceReader:
        return SluiceStoreReader(self.options)
