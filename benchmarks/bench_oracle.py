"""Benchmark the abstract-expression pruning oracle (mugraph.search.oracle).

For a few target programs (attention, rmsnorm_linear, gated_mlp, lora) it builds the oracle
once (saturation and export times reported separately), then asks it about a corpus of
candidate terms such as the search produces (the inputs, operators applied to them, matmuls and
reductions over the divisors of the program's sizes, two levels deep, plus every sub-term of the
target), and prints the median / p90 time of an uncached query (first time the term is asked)
and of a cached one (asked again).  ``--z3`` also times the paper's Z3 oracle on a sample.

Run: ``python benchmarks/bench_oracle.py [--z3] [--corpus N]``.
"""

from __future__ import annotations

import argparse
import itertools
import random
import statistics
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass

from mugraph.search.oracle import SubexprOracle, Z3SubexprOracle
from mugraph.semantics import abstract as ab
from mugraph.semantics.abstract import Term


def mm(a: Term, b: Term, k: int) -> Term:
    return ab.sum(k, ab.mul(a, b))


@dataclass(frozen=True)
class Program:
    name: str
    target: Term
    inputs: tuple[Term, ...]
    sizes: tuple[int, ...]  # the dims a reduction or matmul may run over


def attention(d: int = 128, n: int = 4096) -> Program:
    q, k, v = ab.var("Q"), ab.var("K"), ab.var("V")
    e = ab.exp(mm(q, k, d))
    return Program(f"attention d={d} n={n}", ab.div(mm(e, v, n), ab.sum(n, e)), (q, k, v), (d, n))


def rmsnorm_linear(k: int = 4096) -> Program:
    x, w = ab.var("X"), ab.var("W")
    return Program(f"rmsnorm_linear k={k}", mm(ab.rms_norm(k, x), w, k), (x, w), (k,))


def gated_mlp(k: int = 4096) -> Program:
    x, w1, w3 = ab.var("X"), ab.var("W1"), ab.var("W3")
    target = ab.mul(ab.silu(mm(x, w1, k)), mm(x, w3, k))
    return Program(f"gated_mlp k={k}", target, (x, w1, w3), (k,))


def lora(k: int = 4096, r: int = 16) -> Program:
    x, w, a, b = ab.var("X"), ab.var("W"), ab.var("A"), ab.var("B")
    target = ab.add(mm(x, w, k), mm(mm(x, a, k), b, r))
    return Program(f"lora k={k} r={r}", target, (x, w, a, b), (k, r))


PROGRAMS: tuple[Callable[[], Program], ...] = (attention, rmsnorm_linear, gated_mlp, lora)


def divisors(n: int) -> list[int]:
    return [d for d in range(2, n + 1) if n % d == 0]


def grow(terms: list[Term], sizes: list[int], rng: random.Random, cap: int) -> list[Term]:
    """One level of candidate terms over ``terms``: what one more operator can compute."""
    out: list[Term] = []
    for t in terms:
        out += [ab.exp(t), ab.sqrt(t), ab.silu(t), ab.mul(t, t)]
        out += [ab.sum(s, t) for s in rng.sample(sizes, min(4, len(sizes)))]
    for a, b in itertools.permutations(terms, 2):
        out += [ab.add(a, b), ab.mul(a, b), ab.div(a, b)]
        out += [mm(a, b, s) for s in rng.sample(sizes, min(2, len(sizes)))]
    rng.shuffle(out)
    return out[:cap]


def corpus(program: Program, size: int, seed: int = 0) -> list[Term]:
    rng = random.Random(seed)
    sizes = sorted({d for s in program.sizes for d in divisors(s)} | {3, 5})
    level1 = grow(list(program.inputs), sizes, rng, size // 4)
    level2 = grow(list(program.inputs) + rng.sample(level1, min(12, len(level1))), sizes, rng,
                  size)  # fmt: skip
    terms = list(dict.fromkeys(ab.subterms(program.target) + level1 + level2))
    rng.shuffle(terms)
    return terms[:size]


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def bench(program: Program, size: int, use_z3: bool, z3_sample: int) -> None:
    start = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        oracle = SubexprOracle([program.target])
    build = time.perf_counter() - start
    terms = corpus(program, size)
    answers = [oracle.is_subexpr(t) for t in terms]
    uncached = list(oracle.stats.uncached_seconds)
    for t in terms:
        oracle.is_subexpr(t)
    cached = list(oracle.stats.cached_seconds)
    kept = sum(a.keep for a in answers)
    print(f"\n== {program.name}")
    print(f"   target: {program.target}")
    print(f"   build {build * 1e3:.0f} ms: {oracle.saturation.summary()}")
    print(
        f"   {len(terms)} queries, {kept} kept, {len(terms) - kept} pruned, "
        f"{oracle.stats.undecided} undecided"
    )
    print(
        f"   uncached: median {statistics.median(uncached) * 1e6:.1f} us, "
        f"p90 {percentile(uncached, 0.9) * 1e6:.1f} us, max {max(uncached) * 1e6:.0f} us"
    )
    print(
        f"   cached:   median {statistics.median(cached) * 1e6:.2f} us, "
        f"p90 {percentile(cached, 0.9) * 1e6:.2f} us"
    )
    if use_z3:
        bench_z3(program, oracle, terms, z3_sample)


def bench_z3(program: Program, oracle: SubexprOracle, terms: list[Term], sample: int) -> None:
    """Z3 on a sample of half kept, half pruned queries (as the e-graph answers them)."""
    kept = [t for t in terms if oracle.is_subexpr(t).subexpr][: sample // 2]
    pruned = [t for t in terms if oracle.is_subexpr(t).prune][: sample - len(kept)]
    solver = Z3SubexprOracle([program.target], timeout_ms=500)
    for label, group in (("kept", kept), ("pruned", pruned)):
        start = len(solver.stats.uncached_seconds)
        undecided = solver.stats.undecided
        disagree = 0
        for t in group:
            theirs = solver.is_subexpr(t)
            disagree += theirs.decided and theirs.subexpr != oracle.is_subexpr(t).subexpr
        times = list(solver.stats.uncached_seconds)[start:]
        print(
            f"   z3 (timeout 500 ms), {len(group)} {label} queries: median "
            f"{statistics.median(times) * 1e3:.1f} ms, max {max(times) * 1e3:.0f} ms, "
            f"{solver.stats.undecided - undecided} undecided, {disagree} disagree"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--corpus", type=int, default=2000, help="queries per program")
    parser.add_argument("--z3", action="store_true", help="also time the Z3 oracle")
    parser.add_argument("--z3-sample", type=int, default=30, help="queries given to Z3")
    args = parser.parse_args()
    for make in PROGRAMS:
        bench(make(), args.corpus, args.z3, args.z3_sample)


if __name__ == "__main__":
    main()
