"""The paper's Table 5 for mugraph: search time on GQA as the block-graph size grows, with and
without abstract-expression pruning and canonical form.

    python benchmarks/bench_table5.py [--cap SECONDS] [--ops 4 5 6 7]

Each cell runs one complete search (no iterative deepening: every unit explores up to the
given number of block operators) on the small GQA program of mugraph.library, capped at
``--cap`` seconds; a capped cell prints ">cap". The paper's times (all pruning on, a large
node) were 9 s, 2.3 min, 20 min and 76 min for 4, 5, 6 and 7 operators.
Writes benchmarks/results_table5.json; prints the table last.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from mugraph.library import WORKLOADS
from mugraph.search.driver import superoptimize

VARIANTS = {
    "mugraph": {},
    "no abstract pruning": {"abstract_pruning": False},
    "no canonical form": {"canonical_form": False},
}


def cell(program, ops: int, variant: dict, cap: float, workers: int | None) -> dict:
    result = superoptimize(
        program, time_limit=cap, workers=workers, max_block_ops=ops, deepening=False, **variant
    )
    done = not result.timed_out
    return {
        "seconds": round(result.elapsed, 1),
        "complete": done,
        "states": result.stats.states,
        "verified": len(result.candidates),
        "best_us": round(result.candidates[0].cost * 1e6, 2) if result.candidates else None,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--cap", type=float, default=120.0)
    parser.add_argument("--ops", type=int, nargs="*", default=[4, 5, 6, 7])
    parser.add_argument("--workers", type=int, default=None)
    args = parser.parse_args()
    workload = WORKLOADS["attention_mirage_gqa"]
    program = workload.naive(workload.small)
    rows = {}
    for ops in args.ops:
        for name, variant in VARIANTS.items():
            rows[f"{ops}|{name}"] = cell(program, ops, variant, args.cap, args.workers)
            print(ops, name, rows[f"{ops}|{name}"], flush=True)
    Path(__file__).with_name("results_table5.json").write_text(json.dumps(rows, indent=1))
    print(f"\nGQA (small shapes), search time per max block operators, cap {args.cap:.0f} s")
    print(f"{'block ops':>10}" + "".join(f"{n:>24}" for n in VARIANTS))
    for ops in args.ops:
        cells = []
        for name in VARIANTS:
            r = rows[f"{ops}|{name}"]
            text = f"{r['seconds']:.1f} s" if r["complete"] else f">{args.cap:.0f} s"
            cells.append(f"{text} ({r['states']} st)")
        print(f"{ops:>10}" + "".join(f"{c:>24}" for c in cells))


if __name__ == "__main__":
    main()
