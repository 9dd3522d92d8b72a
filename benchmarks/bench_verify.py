"""Time the probabilistic equivalence verifier on every suite program (CPU only).

The cases: every row of the benchmark suite (``benchmarks/suite/rows.py``) at its suite sizes,
each with the μGraph mugraph runs for it (:func:`benchmarks.suite.mugraphs.choose`: the
search's result, else the hand-written one) and, for attention rows, the library's other
attention form (the one-kernel ``attention_flash`` beside the split-KV FlashDecoding form);
then every hand-written μGraph of ``mugraph.library`` at its ``suite`` sizes (among them the
Fig 4c GQA form). Each is verified against its naive program
with :func:`mugraph.verify` exactly as the search and the API do (δ = 1e-9).

Columns: the milliseconds per round of a ``verify`` call of ``--rounds`` rounds (wall time of the
rounds divided by their number; best of ``--reps`` calls), the same for a search candidate
(``candidate ms``: the rounds of :class:`~mugraph.search.verify.ProgramRounds`, which keeps
the program's side of each round for the next candidate, within the search driver's memory
cap per worker; blank before it existed), the
rounds ``verify`` runs by default (the plan for δ, capped at ``max_rounds`` = 64), their total
time, and the guarantee. The table is printed last.

    python benchmarks/bench_verify.py [--rounds N] [--reps N] [--only SUBSTR[,SUBSTR]]
        [--library-only | --rows-only]

Timings are wall-clock on a shared machine: the header gives its load average.
"""

from __future__ import annotations

import argparse
import gc
import math
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.suite.mugraphs import choose  # noqa: E402
from benchmarks.suite.rows import ROWS  # noqa: E402
from mugraph.library import WORKLOADS  # noqa: E402
from mugraph.search import verify as verify_module  # noqa: E402
from mugraph.search.work import ROUND_BYTES  # noqa: E402

DELTA = 1e-9
MAX_ROUNDS = 64  # verify's default cap
SESSION_BYTES = ROUND_BYTES


@dataclass
class Case:
    name: str
    graph_label: str
    candidate: object
    program: object


@dataclass
class Row:
    case: str
    graph: str
    elements: int
    round_ms: float
    candidate_ms: float | None
    rounds: int
    guarantee: str

    @property
    def total_s(self) -> float:
        return self.round_ms * self.rounds / 1e3


def _wanted(name: str, only: list[str] | None) -> bool:
    """``only``: substrings of case names, or exact names written ``=name``."""
    if not only:
        return True
    return any(name == s[1:] if s.startswith("=") else s in name for s in only)


def _row_cases(only) -> list[Case]:
    out = []
    for name, row in ROWS.items():
        if not _wanted(name, only):
            continue
        choice = choose(row)
        if choice.graph is None:
            print(f"{name}: no μGraph ({choice.note})", flush=True)
            continue
        program = row.program()
        out.append(Case(name, f"{choice.source}: {choice.label}", choice.graph, program))
        if row.attention:
            is_flash = choice.label.startswith("flash")
            other = next((c for c in choice.candidates if c[0].startswith("flash") != is_flash),
                         None)
            if other is not None:
                out.append(Case(name, f"hand-written: {other[0]}", other[1], program))
    return out


def _library_cases(only) -> list[Case]:
    out = []
    for name, work in WORKLOADS.items():
        if not _wanted(f"library {name}", only):
            continue
        out.append(Case(f"library {name}", "hand-written (suite sizes)",
                        work.optimized(work.suite), work.naive(work.suite)))
    return out


def _per_round_ms(run, reps: int) -> tuple[float, object]:
    best, result = math.inf, None
    for _ in range(reps):
        result = run()
        if not result.passed:
            return math.nan, result
        best = min(best, result.elapsed / max(1, result.rounds))
    return best * 1e3, result


def measure(case: Case, rounds: int, reps: int) -> Row:
    elements = sum(math.prod(t.dims) for t in case.program.input_types)
    round_ms, result = _per_round_ms(
        lambda: verify_module.verify(case.candidate, case.program, DELTA, max_rounds=rounds,
                                     seed=0), reps)
    guarantee = result.guarantee if result.passed else f"FAILED: {result.failure}"
    candidate_ms = None
    session_type = getattr(verify_module, "ProgramRounds", None)
    if session_type is not None and result.passed:
        # as a search worker does: the program's side kept (within the driver's memory cap)
        session = session_type(case.program, seed=1, max_bytes=SESSION_BYTES)
        session.verify(case.candidate, DELTA, max_rounds=rounds)  # fills the program side
        candidate_ms, _ = _per_round_ms(
            lambda: session.verify(case.candidate, DELTA, max_rounds=rounds), reps)
        del session
    gc.collect()  # deferred values and their context refer to each other
    planned, _, _ = verify_module.rounds_for(case.candidate, case.program, DELTA)
    return Row(case.name, case.graph_label, elements, round_ms, candidate_ms,
               min(planned, MAX_ROUNDS), guarantee)


def _table(rows: list[Row]) -> str:
    head = ("program", "μGraph", "inputs", "ms / round", "candidate ms", "rounds", "total s",
            "guarantee")
    body = [(r.case, r.graph, f"{r.elements / 1e6:.1f}M", f"{r.round_ms:.1f}",
             "" if r.candidate_ms is None else f"{r.candidate_ms:.1f}", str(r.rounds),
             f"{r.total_s:.1f}", r.guarantee) for r in rows]
    widths = [max(len(str(x)) for x in col) for col in zip(head, *body, strict=True)]
    lines = ["| " + " | ".join(str(x).ljust(w) for x, w in zip(head, widths, strict=True)) + " |",
             "|" + "|".join("-" * (w + 2) for w in widths) + "|"]
    lines += ["| " + " | ".join(str(x).ljust(w) for x, w in zip(r, widths, strict=True)) + " |"
              for r in body]
    over = [r for r in rows if not r.round_ms <= 100]
    lines.append("")
    lines.append(f"{len(rows)} cases; {len(rows) - len(over)} at <= 100 ms per round"
                 + (f"; over: {', '.join(f'{r.case} ({r.round_ms:.0f})' for r in over)}"
                    if over else ""))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=4, help="rounds per timed verify call")
    parser.add_argument("--reps", type=int, default=2, help="timed verify calls per case")
    parser.add_argument("--only", default=None,
                        help="comma-separated substrings of case names (=name: exactly)")
    parser.add_argument("--library-only", action="store_true")
    parser.add_argument("--rows-only", action="store_true")
    args = parser.parse_args(argv)
    only = args.only.split(",") if args.only else None
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    print(f"verifier timings: {os.cpu_count()} CPUs, load average {load}", flush=True)
    cases = [] if args.library_only else _row_cases(only)
    cases += [] if args.rows_only else _library_cases(only)
    rows = []
    started = time.perf_counter()
    for case in cases:
        row = measure(case, args.rounds, args.reps)
        cand = "" if row.candidate_ms is None else f", candidate {row.candidate_ms:.1f} ms"
        print(f"{case.name} [{case.graph_label}]: {row.round_ms:.1f} ms per round{cand}",
              flush=True)
        rows.append(row)
    print(f"\n({time.perf_counter() - started:.0f} s)\n")
    print(_table(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
