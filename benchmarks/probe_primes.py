"""A verification round over the large primes against the small pair, alternated (CPU).

    python benchmarks/probe_primes.py [--only gated_mlp_b1 ...] [--trials 3]

For each suite case (``bench_verify``'s cases, ``--only`` as there), ``verify`` runs 4 rounds
over the large primes (``field_arith.P, Q``) and over the small pair (``P_SMALL, Q_SMALL``),
one after the other, ``--trials`` times; prints the best ms per round of each and which pair
``choose_primes`` takes for the case. Alternating the two in
one process keeps this machine's drift (30-50% within minutes) out of the ratio.
"""

from __future__ import annotations

import argparse
import gc
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_verify  # noqa: E402

from mugraph.search import verify as verify_module  # noqa: E402

DEFAULT_CASES = ("=gated_mlp_b1", "=gated_mlp_b4", "=rmsnorm_linear_b8",
                 "=rmsnorm_linear_llama3_8b_b16", "=lora_llama7b_b1", "library gated_mlp")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--only", nargs="+", default=list(DEFAULT_CASES))
    p.add_argument("--trials", type=int, default=3)
    args = p.parse_args()
    cases = bench_verify._row_cases(args.only) + bench_verify._library_cases(args.only)
    pairs = {"large": verify_module.LARGE_PRIMES, "small": verify_module.SMALL_PRIMES}
    print("| case | large ms / round | small ms / round | small / large | auto |")
    print("| --- | --- | --- | --- | --- |")
    for case in cases:
        best = dict.fromkeys(pairs, float("inf"))
        for trial in range(args.trials):
            for name, primes in pairs.items():
                result = verify_module.verify(case.candidate, case.program, bench_verify.DELTA,
                                              max_rounds=4, seed=trial, primes=primes)
                if not result.passed:
                    raise SystemExit(f"{case.name} over {name} primes: {result}")
                best[name] = min(best[name], result.elapsed / result.rounds * 1e3)
                gc.collect()
        pair = verify_module.difference(verify_module.analyse(case.candidate),
                                        verify_module.analyse(case.program))
        auto = verify_module.choose_primes(pair, bench_verify.DELTA)
        label = next(name for name, primes in pairs.items() if primes == auto)
        print(f"| {case.name} | {best['large']:.1f} | {best['small']:.1f} | "
              f"{best['small'] / best['large']:.2f} | {label} |", flush=True)


if __name__ == "__main__":
    main()
