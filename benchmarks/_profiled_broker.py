"""Run `sluice broker` with every thread under cProfile; merged stats go to argv[1] at SIGTERM.

    python benchmarks/_profiled_broker.py OUT.prof broker --store DIR --listen HOST:PORT ...

cProfile only sees the thread it is enabled in, so the event loop thread and
every store thread (the broker's pool, dispatch, flush) get their own profiler
through ``threading.setprofile``-free wrapping: each thread started after this
point runs its target inside an enabled Profile.
"""
from __future__ import annotations

import cProfile
import pstats
import sys
import threading

profiles: list[cProfile.Profile] = []
_orig_run = threading.Thread.run


def _profiled_run(self: threading.Thread) -> None:
    prof = cProfile.Profile()
    profiles.append(prof)
    prof.enable()
    try:
        _orig_run(self)
    finally:
        prof.disable()


def main() -> None:
    out = sys.argv[1]
    threading.Thread.run = _profiled_run  # type: ignore[method-assign]
    from sluice.cli import main as cli_main

    main_prof = cProfile.Profile()
    profiles.append(main_prof)
    main_prof.enable()
    try:
        cli_main.main(sys.argv[2:], standalone_mode=False)
    finally:
        main_prof.disable()
        for p in profiles:
            p.disable()  # threads still running (daemons) stop recording here
        stats = pstats.Stats(profiles[0])
        for p in profiles[1:]:
            try:
                stats.add(p)
            except TypeError:  # a profiler that never recorded anything
                pass
        stats.dump_stats(out)


if __name__ == "__main__":
    main()
