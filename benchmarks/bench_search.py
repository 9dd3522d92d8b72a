"""Discovery benchmark: run the search on each suite program's naive form and report what it
found against the hand-written μGraph of mugraph.library (by the cost model's estimate).

    python benchmarks/bench_search.py [--shapes small|suite] [--time-limit S] [NAME ...]

Prints one row per workload, the table last; writes benchmarks/results_search_<shapes>.json.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from mugraph.library import WORKLOADS
from mugraph.search.driver import default_cost, reference_recheck, superoptimize

# Which naive program each library workload searches from (the attention variants share one).
PROGRAMS = {
    "rmsnorm_linear": "rmsnorm_linear",
    "gated_mlp": "gated_mlp",
    "lora": "lora",
    "adapter_mlp": "adapter_mlp",
    "attention_flashdecoding": "attention_flashdecoding",
    "attention_mirage_gqa": "attention_mirage_gqa",
}


def kernels_of(graph) -> int:
    return sum(1 for op in graph.ops if op.kind.value == "customized")


def run_one(name: str, shapes: str, time_limit: float, workers: int | None) -> dict:
    workload = WORKLOADS[name]
    sizes = workload.small if shapes == "small" else workload.suite
    program = workload.naive(sizes)
    hand = workload.optimized(sizes)
    first: list[float] = []
    started = time.monotonic()

    def progress(line: str) -> None:
        if not first and " verified 0 " not in line and "verified" in line:
            first.append(time.monotonic() - started)

    result = superoptimize(program, time_limit=time_limit, workers=workers, progress=progress)
    best = result.best
    row = {
        "workload": name,
        "shapes": shapes,
        "found": best is not None,
        "first_found_s": round(first[0], 1) if first else None,
        "elapsed_s": round(result.elapsed, 1),
        "states": result.stats.states,
        "units": f"{result.units_done}/{result.units_total}",
        "verified": len(result.candidates),
        "naive_est_us": round(default_cost(program) * 1e6, 2),
        "hand_est_us": round(default_cost(hand) * 1e6, 2),
        "best_est_us": round(result.candidates[0].cost * 1e6, 2) if best is not None else None,
        "best_kernels": kernels_of(best) if best is not None else None,
    }
    if best is not None:
        row["as_good_as_hand"] = row["best_est_us"] <= row["hand_est_us"] * 1.001
        row["float_recheck_rel_err"] = reference_recheck(best, program)
        row["best_json"] = json.loads(best.to_json())
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("names", nargs="*", default=list(PROGRAMS))
    parser.add_argument("--shapes", choices=["small", "suite"], default="small")
    parser.add_argument("--time-limit", type=float, default=120.0)
    parser.add_argument("--workers", type=int, default=None)
    args = parser.parse_args()
    rows = []
    for name in args.names:
        row = run_one(name, args.shapes, args.time_limit, args.workers)
        rows.append(row)
        print({k: v for k, v in row.items() if k != "best_json"}, flush=True)
    out = Path(__file__).with_name(f"results_search_{args.shapes}.json")
    out.write_text(json.dumps(rows, indent=1))
    header = (
        f"{'workload':26}{'found':>6}{'first s':>9}{'states':>10}{'kernels':>8}"
        f"{'naive us':>10}{'hand us':>9}{'best us':>9}  as good as hand"
    )
    print(header)
    for r in rows:
        best = f"{r['best_est_us']:.2f}" if r["found"] else "-"
        first = f"{r['first_found_s']:.1f}" if r["first_found_s"] is not None else "-"
        print(
            f"{r['workload']:26}{str(r['found']):>6}{first:>9}{r['states']:>10}"
            f"{str(r['best_kernels'] or '-'):>8}{r['naive_est_us']:>10.2f}{r['hand_est_us']:>9.2f}"
            f"{best:>9}  {r.get('as_good_as_hand', '-')}"
        )


if __name__ == "__main__":
    main()
