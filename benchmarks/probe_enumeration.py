"""The search's enumeration alone, timed: every sixth unit of gqa_b1's plan (the suite row at
suite sizes, as ``superoptimize`` plans it) run in this process with the verifier replaced by
one that declines every candidate, so what is timed is the block- and kernel-level walk, the
abstract-expression pruning and the continuations' memo; the states counted must not change
with the code.

    python benchmarks/probe_enumeration.py [--every 6] [--reps 2]

Prints the units, the states and the best of ``--reps`` passes (the continuations' memo is
cleared before each).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--every", type=int, default=6)
    parser.add_argument("--reps", type=int, default=2)
    args = parser.parse_args()
    os.environ.setdefault("MUGRAPH_VERIFY_THREADS", "1")
    from benchmarks.bench_scaling import cell_program
    from mugraph.search import driver, generator, work
    from mugraph.search.config import default_config
    from mugraph.search.verify import NotVerifiableError

    program, _ = cell_program("gqa_b1")
    cfg = default_config(program)
    setup = work.SearchSetup("enumeration", program.to_json(), cfg,
                             driver._OracleAdapter(driver.program_terms(program)))  # fmt: skip

    def declined(*_args, **_kwargs):
        raise NotVerifiableError("enumeration only")

    work._verify = declined
    units = driver.plan_units(program, cfg)[:: args.every]
    best, states = float("inf"), 0
    for _ in range(args.reps):
        generator._WORKER_MEMO.clear()
        started, states = time.perf_counter(), 0
        for kernels, cap, choice in units:
            item = work.WorkItem(kernels, cap, choice)
            states += work.run_item(setup, item, time.monotonic() + 600).stats.states
        best = min(best, time.perf_counter() - started)
    print(f"{len(units)} units, {states} states, best {best:.2f} s")


if __name__ == "__main__":
    main()
