"""HoldService.dispatch_batch (columnar dispatch) wakes exactly the held pulls dispatch(requests) wakes."""
from __future__ import annotations

import asyncio

from sluice.broker.filtering import SelectorFilter
from sluice.broker.longpoll import TIMED_OUT, HoldService
from sluice.filter import compile_selector
from sluice.protocol import properties as P
from sluice.store.dispatch_columns import DispatchBatch, PutRun


def _run(topic: str, qid: int, first_qoff: int, phys0: int, tags: list[str | None], colors: list[str]) -> PutRun:
    props = [P.encode_properties({**({P.TAGS: t} if t else {}), "color": c}) for t, c in zip(tags, colors)]
    n = len(tags)
    return PutRun(topic, qid, [100] * n, [0] * n, props, tags, [None] * n, [None] * n,
                  phys=[phys0 + 100 * i for i in range(n)], qoffs=list(range(first_qoff, first_qoff + n)),
                  store_timestamp=1)


def _outcomes(columnar: bool) -> list[int]:
    async def main() -> list[int]:
        hold = HoldService(lambda t, q: 0, check_interval_s=60)
        hold.start()
        filters = [None, SelectorFilter(compile_selector("TAG", "TagB")),
                   SelectorFilter(compile_selector("SQL92", "color = 'red'")),
                   SelectorFilter(compile_selector("TAG", "TagZ")), None]
        keys = [("T", 0), ("T", 0), ("T", 1), ("T", 1), ("Other", 0)]
        offsets = [5, 0, 0, 0, 0]
        tasks = [asyncio.create_task(hold.hold(t, q, off, f, 0.5))
                 for (t, q), off, f in zip(keys, offsets, filters)]
        await asyncio.sleep(0.01)
        batch = DispatchBatch([_run("T", 0, 0, 0, ["TagA", "TagB"], ["red", "blue"]),
                               _run("T", 1, 0, 200, [None, "TagA"], ["blue", "red"])])
        fn = hold.dispatch_batch if columnar else (lambda b: hold.dispatch(b.requests()))
        await asyncio.to_thread(fn, batch)
        out = await asyncio.gather(*tasks)
        await hold.stop()
        return out
    return asyncio.run(main())


def test_dispatch_batch_matches_request_dispatch():
    got = _outcomes(columnar=True)
    # queue offset 5 not reached; TagB present; a red message on queue 1; no TagZ; nothing for Other
    assert got == [TIMED_OUT, 400, 400, TIMED_OUT, TIMED_OUT]
    assert got == _outcomes(columnar=False)


def test_dispatch_batch_without_held_pulls_builds_no_requests():
    hold = HoldService(lambda t, q: 0)
    batch = DispatchBatch([_run("T", 0, 0, 0, ["TagA"], ["red"])])
    hold.dispatch_batch(batch)
    assert not batch.materialised
