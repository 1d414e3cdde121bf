"""What a bulk job (``sluice spark scan|stats|backfill``) shows while it runs, and its closing summary.

On a terminal a rich progress display follows Spark's stages through the SparkContext's status
tracker (tasks done of tasks planned, the job's phase, time elapsed); piped output or ``--quiet``
shows none of it, so logs and scripts get only the result. The summary is one line on stderr (stdout
keeps the command's JSON), left out under ``--quiet``.
"""
from __future__ import annotations

import threading
import time
from types import TracebackType
from typing import TYPE_CHECKING

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

#: Seconds between two looks at Spark's status tracker (each is a few py4j calls).
POLL_SECONDS = 0.25


class JobProgress:
    """Context manager: ``with JobProgress(console, "scan", quiet=q) as p: p.attach(spark); p.phase("writing")``.

    Shows nothing unless ``console`` is a terminal and ``quiet`` is false. ``summary(text)`` prints the
    closing line (with the elapsed time) unless ``quiet``."""

    def __init__(self, console: Console, job: str, *, quiet: bool = False) -> None:
        self.console = console
        self.job = job
        self.quiet = quiet
        self.live = console.is_terminal and not quiet
        self.started = time.monotonic()
        self.tasks_done = 0  # over finished stages, for the summary
        self._spark: SparkSession | None = None
        self._phase = "starting Spark"
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._progress = Progress(SpinnerColumn(), TextColumn("[bold]{task.description}"), BarColumn(),
                                  MofNCompleteColumn(), TextColumn("tasks"), TimeElapsedColumn(),
                                  console=console, transient=True)
        self._bar = self._progress.add_task(f"{job}: {self._phase}", total=None)

    def __enter__(self) -> JobProgress:
        if self.live:
            self._progress.start()
            self._thread = threading.Thread(target=self._poll, name="sluice-job-progress", daemon=True)
            self._thread.start()
        return self

    def __exit__(self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        if self.live:
            self._progress.stop()

    def attach(self, spark: SparkSession) -> None:
        """Follow ``spark``'s stages from now on (on a terminal, the Spark UI's address is printed once)."""
        self._spark = spark
        self.phase("planning")
        url = spark.sparkContext.uiWebUrl
        if self.live and url:
            self.console.print(f"{self.job}: Spark UI at {url}", highlight=False)

    def phase(self, text: str) -> None:
        """Name what the job is doing now (shown before the task counts)."""
        self._phase = text
        self._progress.update(self._bar, description=f"{self.job}: {text}")

    def summary(self, text: str) -> None:
        if not self.quiet:
            self.console.print(f"{self.job}: {text} in {time.monotonic() - self.started:.1f} s",
                               highlight=False, soft_wrap=True)

    def _poll(self) -> None:
        # Stages seen running (or with tasks done) are refreshed on every look, so one that ends between
        # two looks still counts whole; stages a job skipped (cached, reused shuffle) never run and are left out.
        seen: dict[int, tuple[int, int]] = {}
        while not self._stop.wait(POLL_SECONDS):
            spark = self._spark
            if spark is None:
                continue
            try:
                tracker = spark.sparkContext.statusTracker()
                active = sorted(tracker.getActiveStageIds())
                candidates = set(seen) | set(active)
                for jid in tracker.getActiveJobsIds():
                    job = tracker.getJobInfo(jid)
                    candidates.update(job.stageIds if job is not None else ())
                for sid in candidates:
                    info = tracker.getStageInfo(sid)
                    if info is not None and (sid in seen or sid in active or info.numCompletedTasks > 0):
                        seen[sid] = (info.numCompletedTasks, info.numTasks)
            except Exception:  # noqa: BLE001 - the session is stopping; the display just stops moving
                return
            done = sum(d for d, _ in seen.values())
            total = sum(t for _, t in seen.values())
            self.tasks_done = done
            running = f" (stage {', '.join(map(str, active))})" if active else ""
            self._progress.update(self._bar, completed=done, total=total or None,
                                  description=f"{self.job}: {self._phase}{running}")
