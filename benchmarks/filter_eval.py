"""Filter evaluation benchmark: compiled vs interpreter, batch vs per-message matches, tag mask.

Run alone: .venv/bin/python benchmarks/filter_eval.py [--quick]; the last line is one JSON object.
"""
from __future__ import annotations

import argparse
import json
import random
import time

import numpy as np

from sluice.filter import TagSelector, compile_selector, tag_code

EXPRESSION = "(TAGS IN ('TagA', 'TagB') AND a BETWEEN 10 AND 500) OR (region = 'eu' AND price > 99.5)"


def messages(n: int, seed: int = 11) -> list[dict[str, str]]:
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        props = {"TAGS": rng.choice(["TagA", "TagB", "TagC"]), "region": rng.choice(["eu", "us", "ap"]),
                 "UNIQ_KEY": "7F0000010B6418B4AAC2", "KEYS": "k"}
        if rng.random() < 0.9:
            props["a"] = str(rng.randint(0, 1000))
        if rng.random() < 0.8:
            props["price"] = f"{rng.uniform(0, 200):.2f}"
        out.append(props)
    return out


def per_second(fn, n: int, repeat: int) -> float:  # type: ignore[no-untyped-def]
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return n / best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="smaller sizes (under a minute)")
    args = parser.parse_args()
    n = 20_000 if args.quick else 200_000
    n_interp = 5_000 if args.quick else 50_000
    n_codes = 1_000_000
    repeat = 3 if args.quick else 5

    selector = compile_selector("SQL92", EXPRESSION)
    batch = messages(n)
    small = batch[:n_interp]

    compiled_rate = per_second(lambda: [selector.evaluate(p) for p in small], n_interp, repeat)
    interp_rate = per_second(lambda: [selector.interpret(p) for p in small], n_interp, repeat)
    loop_rate = per_second(lambda: [selector.matches(p) for p in batch], n, repeat)
    batch_rate = per_second(lambda: selector.matches_batch(batch), n, repeat)
    assert selector.matches_batch(batch).tolist() == [selector.matches(p) for p in batch]

    tags = TagSelector("TagA || TagB")
    pool = np.array([tag_code(f"Tag{c}") for c in "ABCDEFGH"], dtype=np.int64)
    codes = pool[np.random.default_rng(3).integers(0, len(pool), size=n_codes)]
    tag_rate = per_second(lambda: tags.match_codes(codes), n_codes, repeat)
    matched = int(tags.match_codes(codes).sum())

    start = time.perf_counter()
    for i in range(200):
        compile_selector("SQL92", f"a > {i} AND b IN ('x', 'y') OR c IS NULL")
    compile_ms = (time.perf_counter() - start) / 200 * 1000

    result = {
        "benchmark": "filter_eval",
        "quick": args.quick,
        "expression": EXPRESSION,
        "compiled_evals_per_s": round(compiled_rate),
        "interpreter_evals_per_s": round(interp_rate),
        "compiled_vs_interpreter_speedup": round(compiled_rate / interp_rate, 1),
        "matches_loop_per_s": round(loop_rate),
        "matches_batch_per_s": round(batch_rate),
        "batch_vs_loop_speedup": round(batch_rate / loop_rate, 2),
        "tag_mask_codes_per_s": round(tag_rate),
        "tag_mask_1m_ms": round(n_codes / tag_rate * 1000, 2),
        "tag_mask_matched": matched,
        "sql_compile_ms": round(compile_ms, 3),
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
