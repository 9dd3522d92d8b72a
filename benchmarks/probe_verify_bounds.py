"""How fast could a verification round be on this machine? A lower bound per suite case.

``bench_verify.py`` times the verifier; this probe asks what any round of *this design* must
spend, whatever the evaluation does, and compares it with the 100 ms per round of issue 15:

- **Random bits.** Theorem 3 needs every input element drawn uniformly at random in every
  round: one 32-bit value per element of Z_p, one more for the inputs whose Z_q component
  reaches an exponent (the program's own, :func:`mugraph.search.verify.q_inputs`). Priced at
  the rate of NumPy's SFC64 ``random_raw`` (what :func:`_fill_uniform` draws from), measured
  here on all threads, and nothing else of the draw (no masking, conversion or memory).
- **Exact products.** Every matrix product of the program has to be computed exactly modulo
  p at least once (the candidate's may be shared with it). Modulo p ≈ 2^31 a float64 GEMM is
  exact only on operands split into digits (:func:`mugraph.semantics.field_gemm.gemm_plan`:
  at least 2 limbs), i.e. at least ``limbs × 2 × MACs`` float64 flops. Priced at the best
  float64 GEMM rate measured here (several shapes, all threads), and nothing else (no digit
  split, reduction or conversion).
- **Exponentials.** Every exponential of the program (exp, silu, gelu) maps its exponent e
  to ω^e mod p at least once. This design does it with two lookups in tables of sqrt(q)
  powers and one modular product; priced at the measured rate of those four NumPy steps
  (two ``take``, one multiply, one floor division) on cache-resident blocks, all threads.

All three are CPU work on the same cores, so a round takes at least their sum. Cases whose
bound is over ``--budget`` cannot meet it with this design on this machine, however the rest
is written; the others can, as far as these three costs go.

A second bound prices the most favourable variant of the design on the small pair of primes
(``P_SMALL = 2^21 - 9``, ``Q_SMALL = (P_SMALL - 1) / 2``, which the verifier already uses where
they need no more rounds): 21 random bits per value (three values from one 64-bit SFC64
word, nothing counted for splitting them), one float64 GEMM per product (a single limb), and
each exponential one lookup in a table of all q powers of ω (4 MB of int32, measured here).
Whatever its guarantee, no round of this design on this machine is faster than that.

Both count a value for every element and one more for each input whose Z_q component reaches
an exponent. The verifier draws fewer where it never reads a Z_p component (softmax
attention's K): mha_b8 draws 134.5M values a round, not the 201.9M counted. The memory
traffic of the draws (writing and reading every value) is printed beside the bounds, not
added: a draw fused with its product could keep it in cache.

    python benchmarks/probe_verify_bounds.py [--only SUBSTR[,SUBSTR]] [--budget MS]
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.bench_verify import _library_cases, _row_cases  # noqa: E402
from benchmarks.suite.report import markdown_table  # noqa: E402
from mugraph.ir.ops import Group, OpKind  # noqa: E402
from mugraph.search.verify import q_inputs  # noqa: E402
from mugraph.semantics.field_arith import P_SMALL, Q_SMALL, P  # noqa: E402
from mugraph.semantics.field_gemm import gemm_plan  # noqa: E402

_CHUNK = 1 << 15  # uint64 draws per random_raw call, as _fill_uniform draws (64 K values)


@dataclass(frozen=True)
class Rates:
    draw_ns: float  # per 32-bit value, all threads
    gemm_gflops: float  # float64, all threads
    exp_ns: float  # per exponential: two table lookups, a product and a division, all threads
    lookup_ns: float  # per exponential over the small pair: one lookup in a table of Q_SMALL
    write_ns: float  # per float64 element written to memory, all threads
    read_ns: float  # per float64 element read from memory, all threads
    threads: int


def _on_threads(work, threads: int) -> float:
    """Wall seconds of ``work(i)`` on ``threads`` threads at once."""
    pool = [threading.Thread(target=work, args=(i,)) for i in range(threads)]
    start = time.perf_counter()
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    return time.perf_counter() - start


def measure_rates(threads: int, values: int = 1 << 26) -> Rates:
    bits = [np.random.SFC64(i) for i in range(threads)]

    def draw(i: int) -> None:
        for _ in range(0, values // threads // 2, _CHUNK):
            bits[i].random_raw(_CHUNK)

    draw_s = min(_on_threads(draw, threads) for _ in range(3))
    big = np.ones(values)

    def write(i: int) -> None:
        big[i * values // threads : (i + 1) * values // threads].fill(2.0)

    def read(i: int) -> None:
        big[i * values // threads : (i + 1) * values // threads].sum()

    write_s = min(_on_threads(write, threads) for _ in range(3))
    read_s = min(_on_threads(read, threads) for _ in range(3))
    best = 0.0
    for m, k, n in ((1024, 128, 4096), (1024, 4096, 128), (16, 4096, 4096), (2048, 2048, 2048)):
        a, b = np.random.rand(m, k), np.random.rand(k, n)
        c = a @ b
        for _ in range(3):
            start = time.perf_counter()
            np.matmul(a, b, out=c)
            best = max(best, 2 * m * k * n / (time.perf_counter() - start) / 1e9)
    return Rates(draw_s / values * 1e9, best, _exp_ns(threads), _lookup_ns(threads),
                 write_s / values * 1e9, read_s / values * 1e9, threads)


def _exp_ns(threads: int, block: int = 1 << 14, rounds: int = 2000) -> float:
    """Per element, all threads: ω^e = lo[e & mask] · hi[e >> bits] mod p, the steps of
    ``FieldContext._exp_p`` that no exponential can skip (masking and shifting not counted)."""
    table = np.random.default_rng(0).integers(0, P, 1 << 15)
    index = np.random.default_rng(1).integers(0, 1 << 15, block)

    def work(i: int) -> None:
        low, high, out = (np.empty(block, dtype=np.int64) for _ in range(3))
        for _ in range(rounds // threads):
            np.take(table, index, out=low, mode="clip")
            np.take(table, index, out=high, mode="clip")
            np.multiply(low, high, out=low)
            np.floor_divide(low, P, out=out)

    seconds = min(_on_threads(work, threads) for _ in range(3))
    return seconds / (block * (rounds // threads) * threads) * 1e9


def _lookup_ns(threads: int, block: int = 1 << 14, rounds: int = 2000) -> float:
    """Per element, all threads: ω^e as one ``take`` from a table of every power (Q_SMALL
    int32 entries, 4 MB: out of L2, in L3), at uniformly random exponents."""
    table = np.random.default_rng(0).integers(0, P_SMALL, Q_SMALL).astype(np.int32)

    def work(i: int) -> None:
        index = np.random.default_rng(1 + i).integers(0, Q_SMALL, block)
        out = np.empty(block, dtype=np.int32)
        for _ in range(rounds // threads):
            np.take(table, index, out=out, mode="clip")

    seconds = min(_on_threads(work, threads) for _ in range(3))
    return seconds / (block * (rounds // threads) * threads) * 1e9


@dataclass(frozen=True)
class Design:
    """What a round is priced at: ``limbs`` float64 GEMMs per product, ``value_bits`` random
    bits per value (drawn as 64-bit words at the measured rate), exponentials at
    ``exp_ns`` each."""

    name: str
    limbs: int
    value_bits: int
    exp_ns: float


def designs(rates: Rates) -> tuple[Design, Design]:
    """This design over p ≈ 2^31 (32 bits a value, two lookups an exponential) and its most
    favourable variant over the small pair."""
    return (Design("p = 2^31 - 69", fewest_limbs(P), 32, rates.exp_ns),
            Design("p = 2^21 - 9, favourable", fewest_limbs(P_SMALL), 21, rates.lookup_ns))


@dataclass
class Bound:
    case: str
    values: int  # random 32-bit values a round draws at least
    macs: int  # multiply-adds of the program's products
    limbs: int
    exps: int  # exponentials of the program (elements)
    draw_ms: float
    gemm_ms: float
    exp_ms: float
    memory_ms: float

    @property
    def total_ms(self) -> float:
        return self.draw_ms + self.gemm_ms + self.exp_ms


def program_macs(program) -> int:
    """Multiply-adds of the program's matrix products (kernel-level matmuls)."""
    total = 0
    for op in program.ops:
        if op.kind is OpKind.MATMUL:
            k = program.tensor_type(op.inputs[0]).dims[-1]
            total += math.prod(op.outputs[0].dims) * k
    return total


def program_exponentials(program) -> int:
    """Elements of the program's exponentials (exp, silu, gelu: each takes one)."""
    return sum(math.prod(op.outputs[0].dims) for op in program.ops
               if op.kind in Group.EXPONENTIAL)


def fewest_limbs(modulus: int) -> int:
    """The fewest balanced digits with which a float64 GEMM is exact modulo ``modulus``."""
    return next(n for n in range(1, 8) if gemm_plan(modulus, n).chunk >= 1)


def bound(case, rates: Rates, design: Design) -> Bound:
    program = case.program
    with_q = q_inputs(program)
    values = sum(math.prod(t.dims) * (2 if i in with_q else 1)
                 for i, t in enumerate(program.input_types))
    elements = sum(math.prod(t.dims) for t in program.input_types)
    macs = program_macs(program)
    exps = program_exponentials(program)
    return Bound(
        case=case.name,
        values=values,
        macs=macs,
        limbs=design.limbs,
        exps=exps,
        draw_ms=values * rates.draw_ns * design.value_bits / 32 / 1e6,
        gemm_ms=design.limbs * 2 * macs / (rates.gemm_gflops * 1e9) * 1e3,
        exp_ms=exps * design.exp_ns / 1e6,
        memory_ms=elements * (rates.write_ns + rates.read_ns) / 1e6,
    )


def table(design: Design, bounds: list[Bound], budget: float) -> str:
    head = ["case", "random values", "product MACs", "exponentials", "bits ms", "products ms",
            "exp ms", "bound ms", "memory ms", f"over {budget:g} ms"]
    rows = [[b.case, f"{b.values / 1e6:.1f}M", f"{b.macs / 1e9:.2f}G", f"{b.exps / 1e6:.1f}M",
             f"{b.draw_ms:.1f}", f"{b.gemm_ms:.1f}", f"{b.exp_ms:.1f}", f"{b.total_ms:.1f}",
             f"{b.memory_ms:.1f}", "yes" if b.total_ms > budget else ""]
            for b in bounds]
    over = [b.case for b in bounds if b.total_ms > budget]
    summary = (f"{len(bounds)} cases; {len(over)} with a bound over {budget:g} ms per round"
               + (f": {', '.join(over)}" if over else ""))
    title = (f"{design.name}: {design.limbs} float64 GEMM(s) a product, {design.value_bits} "
             f"random bits a value, {design.exp_ns:.3f} ns an exponential")
    return f"{title}\n\n{markdown_table(head, rows)}\n\n{summary}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default=None,
                        help="comma-separated substrings of case names (=name: exactly)")
    parser.add_argument("--budget", type=float, default=100.0, help="ms per round")
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    args = parser.parse_args(argv)
    only = args.only.split(",") if args.only else None
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    rates = measure_rates(args.threads)
    print(f"{os.cpu_count()} CPUs, load average {load}; on {rates.threads} threads: "
          f"SFC64 random_raw {rates.draw_ns:.3f} ns per 32-bit value, float64 GEMM "
          f"{rates.gemm_gflops:.1f} GFLOP/s, an exponential {rates.exp_ns:.3f} ns (one "
          f"lookup: {rates.lookup_ns:.3f}), memory write {rates.write_ns:.3f} / read "
          f"{rates.read_ns:.3f} ns per float64")
    cases = _row_cases(only) + _library_cases(only)
    seen, unique = set(), []
    for case in cases:  # a row's two μGraphs share the program: one bound per program
        if case.name not in seen:
            seen.add(case.name)
            unique.append(case)
    for design in designs(rates):
        print()
        print(table(design, [bound(c, rates, design) for c in unique], args.budget))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
