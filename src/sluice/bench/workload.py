"""The common workload every system runs (issue 15): what is sent, which filters drain it, how latency is paced.

Messages carry a 1 KiB body, a tag (TagA..TagJ) and two properties: ``region`` (10 values) and ``a`` (0..99 as
text). Three filters drain it: tag ``TagA``, ``region = 'eu'`` and ``region = 'eu' AND a >= 50``. Latency is
measured on ``region = 'eu'`` at paced rates. The send time rides in the body's first 20 bytes (nanoseconds of
``time.perf_counter_ns``; producer and consumer share this process), so every system measures it the same way.
"""
from __future__ import annotations

import gc
import random
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from typing import Any

__all__ = [
    "FILTERS", "REGIONS", "TAGS", "Filter", "LatencyProbe", "Props", "Workload", "body_with_stamp",
    "expected_counts", "generate", "paced", "percentile", "produce_rate", "settle_heap", "stamp_of",
]

REGIONS = ("eu", "us", "apac", "latam", "mena", "uk", "ca", "au", "jp", "in")
TAGS = tuple(f"Tag{c}" for c in "ABCDEFGHIJ")
STAMP_LEN = 20


@dataclass(frozen=True)
class Props:
    """One message's routing facts: its tag, region and ``a`` (0..99)."""

    tag: str
    region: str
    a: int


@dataclass(frozen=True)
class Filter:
    """A drain: its row name, the SQL92 / tag expression Sluice uses, and the predicate that decides a match."""

    name: str
    kind: str  # "TAG" or "SQL92"
    expression: str
    matches: Callable[[Props], bool] = field(compare=False, repr=False)


FILTERS = (
    Filter("tag", "TAG", "TagA", lambda p: p.tag == "TagA"),
    Filter("region", "SQL92", "region = 'eu'", lambda p: p.region == "eu"),
    Filter("sql92", "SQL92", "region = 'eu' AND a >= 50", lambda p: p.region == "eu" and p.a >= 50),
)
LATENCY_FILTER = FILTERS[1]


@dataclass(frozen=True)
class Workload:
    """The load of one run (stored in the result so a later run compares like with like)."""

    messages: int = 100_000
    body_size: int = 1024
    batch: int = 32
    threads: int = 4
    latency_rates: tuple[int, ...] = (1_000, 10_000)
    latency_seconds: float = 5.0
    drain_timeout: float = 300.0
    seed: int = 15

    @classmethod
    def quick(cls, messages: int | None = None) -> Workload:
        return cls(messages=messages or 20_000, latency_seconds=2.0, drain_timeout=120.0)

    def as_dict(self) -> dict[str, object]:
        d = asdict(self)
        d["latency_rates"] = list(self.latency_rates)
        d["filters"] = {f.name: f"{f.kind}: {f.expression}" for f in FILTERS}
        return d


def generate(n: int, seed: int) -> list[Props]:
    """The same ``n`` messages for every system (uniform tags, regions and ``a``)."""
    rnd = random.Random(seed)
    return [Props(rnd.choice(TAGS), rnd.choice(REGIONS), rnd.randrange(100)) for _ in range(n)]


def settle_heap() -> None:
    """Put what the bench process holds now (its imports, the workload it just generated: some 136,000
    objects the cyclic garbage collector tracks) out of that collector's reach (``gc.freeze``, as the broker
    does with its startup heap), so a full collection during a measurement walks only what the measured
    client made since. A full collection of the whole heap took 16-18 ms here, and one that fell inside a
    30-60 ms drain cut that drain's figure by a third (2026-11-29). Every system's runner calls this once
    its workload is generated; ``sluice bench`` undoes it (``gc.unfreeze``) after each system."""
    gc.collect()
    gc.freeze()


def expected_counts(props: list[Props]) -> dict[str, int]:
    return {f.name: sum(1 for p in props if f.matches(p)) for f in FILTERS}


def chunks(items: list[Props], threads: int) -> list[list[Props]]:
    """``threads`` contiguous slices covering ``items`` (one per producer thread)."""
    step = -(-len(items) // threads) if items else 0
    return [items[i * step:(i + 1) * step] for i in range(threads)]


def produce_rate(work: Callable[[int, list[Props]], None], props: list[Props], threads: int,
                 what: str) -> float:
    """msgs/s of ``work(n, part)`` run on ``threads`` threads over ``chunks(props, threads)``.

    The first error a thread meets fails the run, named by ``what``, after every thread has ended.
    """
    errors: list[BaseException] = []

    def run(n: int, part: list[Props]) -> None:
        try:
            work(n, part)
        except BaseException as exc:  # reported after the join
            errors.append(exc)

    workers = [threading.Thread(target=run, args=(n, part), name=f"bench-send-{n}")
               for n, part in enumerate(chunks(props, threads))]
    t0 = time.perf_counter()
    for t in workers:
        t.start()
    for t in workers:
        t.join()
    seconds = time.perf_counter() - t0
    if errors:
        raise RuntimeError(f"{what} failed: {errors[0]!r}") from errors[0]
    return len(props) / seconds


def body_with_stamp(size: int, stamp_ns: int = 0) -> bytes:
    """A ``size``-byte body whose first 20 bytes are the send time (zero for throughput runs)."""
    head = f"{stamp_ns:0{STAMP_LEN}d}".encode()
    return head + b"x" * max(0, size - STAMP_LEN)


def stamp_of(body: bytes) -> int:
    return int(body[:STAMP_LEN])


def percentile(sorted_values: list[float], q: float) -> float:
    """Nearest-rank percentile of an ascending list (``q`` in 0..100)."""
    if not sorted_values:
        return float("nan")
    rank = max(1, -(-len(sorted_values) * q // 100))
    return sorted_values[int(rank) - 1]


class LatencyProbe:
    """Collects send→listener latencies from stamped bodies (thread-safe) and waits for a count."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self.latencies_ms: list[float] = []

    def seen(self, body: bytes) -> None:
        now = time.perf_counter_ns()
        stamp = stamp_of(body)
        if stamp <= 0:
            return
        with self._cond:
            self.latencies_ms.append((now - stamp) / 1e6)
            self._cond.notify_all()

    def wait_for(self, count: int, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        with self._cond:
            while len(self.latencies_ms) < count:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cond.wait(left)
            return True

    def summary(self, sent: int, expected: int, seconds: float) -> dict[str, float | int]:
        with self._lock:
            values = sorted(self.latencies_ms)
        return {"p50_ms": round(percentile(values, 50), 3), "p99_ms": round(percentile(values, 99), 3),
                "received": len(values), "expected": expected, "sent": sent,
                "achieved_rate": round(sent / seconds) if seconds > 0 else 0}


def paced(rate: int, seconds: float, seed: int) -> Iterator[tuple[float, Props]]:
    """(due time on the perf_counter clock, props) for ``rate * seconds`` messages evenly spaced; the caller
    sleeps until each is due (and sends at once when behind, so the achieved rate is recorded, not assumed)."""
    n = max(1, int(rate * seconds))
    props = generate(n, seed)
    start = time.perf_counter() + 0.05
    for i, p in enumerate(props):
        yield start + i / rate, p


def wait_until(due: float) -> None:
    # Sleep, never spin: a spinning sender holds the GIL the client's loop and listener threads need.
    left = due - time.perf_counter()
    if left > 0:
        time.sleep(left)


class Counter:
    """A thread-safe count of matched deliveries with the times of the first and the last one."""

    def __init__(self, target: int) -> None:
        self.target = target
        self.count = 0
        self.first = 0.0
        self.last = 0.0
        self._cond = threading.Condition()

    def add(self, n: int = 1) -> None:
        now = time.perf_counter()
        with self._cond:
            if not self.count:
                self.first = now
            self.count += n
            self.last = now
            if self.count >= self.target:
                self._cond.notify_all()

    def wait(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        with self._cond:
            while self.count < self.target:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cond.wait(min(left, 0.5))
            return True

    def rate(self, started: float) -> dict[str, float | int]:
        """matched/s from ``started`` (the drain's start) to the last delivery, plus first→last."""
        with self._cond:
            total = self.last - started if self.count else 0.0
            span = self.last - self.first if self.count > 1 else 0.0
            return {"matched": self.count, "expected": self.target,
                    "matched_per_s": round(self.count / total) if total > 0 else 0,
                    "first_to_last_per_s": round(self.count / span) if span > 0 else 0,
                    "seconds": round(total, 3)}

    def drained(self, started: float, timeout: float, wrong: int = 0, expression: str = "") -> dict[str, Any]:
        """:meth:`rate` plus the drain's ``error``, if any: ``wrong`` deliveries that do not match
        ``expression`` first, else fewer than the target within ``timeout``."""
        out: dict[str, Any] = dict(self.rate(started))
        if wrong:
            out["error"] = f"{wrong} delivered messages do not match {expression!r}"
        elif self.count < self.target:
            out["error"] = f"drained {self.count} of {self.target} within {timeout:g} s"
        return out
