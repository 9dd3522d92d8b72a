"""Time the probabilistic equivalence verifier on every library μGraph (CPU only).

For each workload of ``mugraph.library`` at its ``small`` and ``suite`` sizes, and at the
group-A shapes of ``benchmarks/SUITE.md`` that the library implements (gqa / mha / mqa with
the FlashDecoding μGraph, rmsnorm_linear, gated_mlp and lora, at both batch factors): the best
of a few runs of one verification round's parts, in milliseconds, under the same settings as
``verify`` (:func:`~mugraph.semantics.field_arith.parallel_evaluation`, zero Z_q components for
inputs that need none) — drawing the random inputs, evaluating the candidate μGraph, evaluating
the naive program, and the whole round (both, plus the comparison) — then the rounds
``verify`` plans for δ = 1e-9 (uncapped; ``verify`` stops at ``max_rounds``, 64 by default)
and the guarantee they give. The table is printed last.

    python benchmarks/bench_verify.py [--reps N] [--only NAME[,NAME]] [--shapes small,suite,A]
        [--max-elements N]

Timings are wall-clock on a shared machine: the header gives its load average.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402

from mugraph.errors import MugraphError  # noqa: E402
from mugraph.library import WORKLOADS  # noqa: E402
from mugraph.search.verify import InputBuffers, _one_round, q_inputs, rounds_for  # noqa: E402
from mugraph.semantics.field import FieldInterpretation  # noqa: E402
from mugraph.semantics.field_arith import FieldContext, parallel_evaluation  # noqa: E402
from mugraph.semantics.interpret import run_kernel_graph  # noqa: E402

DELTA = 1e-9
_ATTN = {"parts": 16, "n_tile": 64, "h_tile": 1, "h_tile2": 1}


def _attention(h: int, s: int) -> dict[str, int]:
    return {"h": h, "h_kv": h, "s": s, "d": 64, "n": 4096, **_ATTN,
            "s_parts": 4 if s % 4 == 0 and s >= 64 else 1}


# Group A of benchmarks/SUITE.md, as library sizes: (row, workload, sizes).
GROUP_A: list[tuple[str, str, dict[str, int]]] = [
    ("gqa b1", "attention_flashdecoding", _attention(2, 256)),
    ("gqa b8", "attention_flashdecoding", _attention(16, 256)),
    ("mha b1", "attention_flashdecoding", _attention(32, 16)),
    ("mha b8", "attention_flashdecoding", _attention(256, 16)),
    ("mqa b1", "attention_flashdecoding", _attention(1, 1024)),
    ("mqa b8", "attention_flashdecoding", _attention(8, 1024)),
    ("rmsnorm_linear b1", "rmsnorm_linear", {**WORKLOADS["rmsnorm_linear"].suite, "m": 2}),
    ("rmsnorm_linear b8", "rmsnorm_linear", {**WORKLOADS["rmsnorm_linear"].suite, "m": 16}),
    ("gated_mlp b1", "gated_mlp", {**WORKLOADS["gated_mlp"].suite, "m": 8}),
    ("gated_mlp b4", "gated_mlp", {**WORKLOADS["gated_mlp"].suite, "m": 32}),
    ("lora b1", "lora", {**WORKLOADS["lora"].suite, "m": 16}),
    ("lora b4", "lora", {**WORKLOADS["lora"].suite, "m": 64}),
]


@dataclass
class Row:
    workload: str
    shape: str
    inputs_ms: float
    candidate_ms: float
    naive_ms: float
    round_ms: float
    rounds: str
    guarantee: str


def _best_ms(fn: Callable[[], object], reps: int, budget: float = 20.0) -> float:
    """Best of ``reps`` runs (fewer when one run is long), in milliseconds."""
    best, spent = math.inf, 0.0
    for _ in range(reps):
        start = time.perf_counter()
        fn()
        took = time.perf_counter() - start
        best, spent = min(best, took), spent + took
        if spent > budget:
            break
    return best * 1e3


def measure(workload: str, shape: str, sizes: dict[str, int], reps: int) -> Row:
    work = WORKLOADS[workload]
    candidate, program = work.optimized(sizes), work.naive(sizes)
    needed = q_inputs(candidate) | q_inputs(program)
    rng = np.random.default_rng(0)
    ctx = FieldContext.from_rng(rng)
    buffers = InputBuffers()  # as verify() does: the same memory every round

    def draw():
        return [ctx.random(t.dims, rng, with_q=i in needed,
                           out=buffers.get(i, math.prod(t.dims), i in needed))
                for i, t in enumerate(program.input_types)]

    def evaluate(graph, inputs):
        return run_kernel_graph(FieldInterpretation(ctx), graph.ops, graph.outputs, inputs)

    with parallel_evaluation():
        inputs_ms = _best_ms(draw, reps)
        held = draw()
        candidate_ms = _best_ms(lambda: evaluate(candidate, held), reps)
        naive_ms = _best_ms(lambda: evaluate(program, held), reps)
        failures: list[str] = []

        def one_round():
            answer = _one_round(candidate, program, rng, needed, buffers=buffers)
            if answer is not None:
                failures.append(answer)

        round_ms = _best_ms(one_round, reps)
    rounds, bound, why = rounds_for(candidate, program, DELTA)
    planned = "no bound" if bound is None else str(rounds)
    if failures:
        why = f"FAILED: {failures[0]}"
    return Row(workload, shape, inputs_ms, candidate_ms, naive_ms, round_ms, planned, why)


def _cases(shapes: set[str], only: set[str] | None, max_elements: int):
    for name, work in WORKLOADS.items():
        for label in ("small", "suite"):
            if label in shapes and (only is None or name in only):
                yield name, label, getattr(work, label)
    if "A" in shapes:
        for row, name, sizes in GROUP_A:
            if only is not None and name not in only:
                continue
            graph = WORKLOADS[name].naive(sizes)
            elements = sum(math.prod(t.dims) for t in graph.input_types)
            if elements > max_elements:
                print(f"skipping {row}: {elements} input elements > --max-elements", flush=True)
                continue
            yield name, f"A: {row}", sizes


def _table(rows: list[Row]) -> str:
    head = ("workload", "shape", "inputs ms", "candidate ms", "naive ms", "round ms",
            "rounds (δ=1e-9)", "guarantee")
    body = [(r.workload, r.shape, f"{r.inputs_ms:.1f}", f"{r.candidate_ms:.1f}",
             f"{r.naive_ms:.1f}", f"{r.round_ms:.1f}", r.rounds, r.guarantee) for r in rows]
    widths = [max(len(str(x)) for x in col) for col in zip(head, *body, strict=True)]
    lines = ["| " + " | ".join(str(x).ljust(w) for x, w in zip(head, widths, strict=True)) + " |",
             "|" + "|".join("-" * (w + 2) for w in widths) + "|"]
    lines += ["| " + " | ".join(str(x).ljust(w) for x, w in zip(r, widths, strict=True)) + " |"
              for r in body]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--only", default=None, help="comma-separated workload names")
    parser.add_argument("--shapes", default="small,suite,A")
    parser.add_argument("--max-elements", type=int, default=200_000_000,
                        help="skip group-A rows whose inputs have more elements")
    args = parser.parse_args(argv)
    only = set(args.only.split(",")) if args.only else None
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    print(f"verifier round timings: {os.cpu_count()} CPUs, load average {load}", flush=True)
    rows = []
    for name, label, sizes in _cases(set(args.shapes.split(",")), only, args.max_elements):
        try:
            row = measure(name, label, sizes, args.reps)
        except MugraphError as error:  # a μGraph the library cannot build at this shape
            reason = str(error).splitlines()[0]
            print(f"{name} {label}: skipped ({reason})", flush=True)
            nan = math.nan
            rows.append(Row(name, label, nan, nan, nan, nan, "-", f"not built: {reason}"))
            continue
        print(f"{name} {label}: round {row.round_ms:.1f} ms", flush=True)
        rows.append(row)
    print()
    print(_table(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
