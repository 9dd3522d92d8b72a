"""Estimate against measurement for every μGraph candidate of the suite, on the GPU.

    python benchmarks/bench_ranking.py [ROWS...] [--out DIR] [--reps N] [--tune-top N]
        [--budget S] [--jobs N] [--no-library] [--no-searched]
    python benchmarks/bench_ranking.py --superoptimize ROW [--time-limit S]

For every suite row (``benchmarks/suite``): every verified alternative of its search file
(``benchmarks/searched/<row>.json``, labelled ``s#i``) and every library μGraph the runner
screens for it (the hand-written tilings and one-kernel forms, ``lib:<tiles>``), at the
row's suite sizes. They go through the ranking ``superoptimize`` uses
(:func:`mugraph.optimize.ranking.rank_graphs`): all are compiled and run once in parallel
worker processes, then, one row after the other in one timing worker, each is checked against
the reference semantics on fresh random inputs and timed (median of CUDA-event times, L2
flushed), the program itself too, and the ``--tune-top`` fastest of each row get their launch
settings tuned (until ``--budget`` seconds have passed). A candidate that fails to compile,
faults the GPU or disagrees is excluded with its reason; the run goes on.

Writes ``<out>/ranking_records.jsonl`` (one line per candidate: row, label, graph hash,
kernel structure, estimate, measured medians, launch settings, status, and the graph's JSON
for refitting the cost model) and prints the table of rank correlations between estimate and
measurement (Spearman, per row and overall) and what picking by estimate costs.
Without a CUDA device it only lists the candidates and their estimates.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
if str(HERE.parent) not in sys.path:
    sys.path.insert(0, str(HERE.parent))

from benchmarks.ranking_fit import correlation_table  # noqa: E402

STARTED = time.monotonic()


def log(line: str) -> None:
    print(f"[{time.monotonic() - STARTED:6.1f} s] {line}", file=sys.stderr, flush=True)


def row_entries(row, library: bool, searched: bool):
    """(program, [Entry]) of one row: its searched alternatives and library μGraphs, each
    with the cost model's estimate."""
    from benchmarks.suite.mugraphs import choose, hand_written_choice
    from mugraph.optimize.cost_model import estimate
    from mugraph.optimize.ranking import Entry

    program = row.program()
    graphs = []
    if searched:
        choice = choose(row, "searched")
        graphs += [(f"s#{i}", g) for i, (_, g) in enumerate(choice.candidates)]
    if library:
        hand = hand_written_choice(row)
        graphs += [(f"lib:{label}", g) for label, g in hand.candidates]
    seen, entries = set(), []
    for label, graph in graphs:
        key = graph.structural_hash()
        if key in seen:
            continue
        seen.add(key)
        entries.append(Entry(label, graph, estimate(graph).seconds, key))
    return program, entries


def prepare_all(pools, rows_entries, seed: int) -> dict[tuple[str, str], str]:
    """Compile and run once every candidate of every row, in parallel; {(row, label): why}
    for those that faulted, died or hung (those never reach the timing worker)."""
    from mugraph.optimize.ranking import MeasureTask, prepare_task

    tasks, keys = [], []
    for row, program, entries in rows_entries:
        text = program.to_json()
        for e in entries:
            tasks.append(MeasureTask(e.label, e.graph.to_json(), text, e.hash, seed=seed))
            keys.append((row.name, e.label))
    done = [0]

    def tick(_index, _outcome) -> None:
        done[0] += 1
        if done[0] % 25 == 0 or done[0] == len(tasks):
            log(f"compiled {done[0]}/{len(tasks)} candidates")

    outcomes = pools.compile.run(prepare_task, tasks, on_done=tick)
    bad = {}
    for key, outcome in zip(keys, outcomes, strict=True):
        if not outcome.ok and outcome.kind != "error":
            bad[key] = outcome.describe()
            log(f"{key[0]} {key[1]}: {bad[key]}")
    return bad


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("rows", nargs="*", help="rows or workloads (default: every row)")
    parser.add_argument("--out", type=Path, default=HERE)
    parser.add_argument("--reps", type=int, default=50)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--tune-top", type=int, default=2)
    parser.add_argument("--budget", type=float, default=420.0,
                        help="seconds after which no more tuning starts")
    parser.add_argument("--jobs", type=int, default=None)
    parser.add_argument("--seed", type=int, default=1234)
    parser.add_argument("--task-timeout", type=float, default=120.0)
    parser.add_argument("--no-library", dest="library", action="store_false")
    parser.add_argument("--no-searched", dest="searched", action="store_false")
    parser.add_argument("--superoptimize", metavar="ROW", default=None,
                        help="instead: run superoptimize on ROW's program at suite sizes (the "
                             "search, then the GPU ranking) and print how it ranked")
    parser.add_argument("--time-limit", type=float, default=60.0,
                        help="search seconds for --superoptimize")
    args = parser.parse_args(argv)
    if args.superoptimize:
        return run_superoptimize(args)

    from benchmarks.suite import select
    from mugraph.optimize.ranking import Pools, RankingOptions, cuda_present, rank_graphs

    rows = select(args.rows, None)
    rows_entries = []
    for row in rows:
        try:
            program, entries = row_entries(row, args.library, args.searched)
        except Exception as error:  # noqa: BLE001 - a row that cannot be built is reported
            log(f"{row.name}: no candidates: {type(error).__name__}: {error}")
            continue
        rows_entries.append((row, program, entries))
    total = sum(len(e) for _, _, e in rows_entries)
    log(f"{len(rows_entries)} rows, {total} candidates")
    if not cuda_present():
        for row, _, entries in rows_entries:
            for e in entries:
                print(f"{row.name:32} {e.label:40} {e.estimate * 1e6:9.2f} us est.")
        print("no CUDA device: nothing measured")
        return 0

    args.out.mkdir(parents=True, exist_ok=True)
    records_path = args.out / "ranking_records.jsonl"
    records_path.write_text("")
    options = RankingOptions(mode="gpu", reps=args.reps, warmup=args.warmup, jobs=args.jobs,
                             task_timeout=args.task_timeout)
    pools = Pools.for_options(options)
    lines = []
    try:
        bad = prepare_all(pools, rows_entries, args.seed)
        log(f"compile step done ({pools.compile.started} compile workers)")
        for index, (row, program, entries) in enumerate(rows_entries):
            tune = args.tune_top if time.monotonic() - STARTED < args.budget else 0
            live = [e for e in entries if (row.name, e.label) not in bad]
            n = max(1, len(live))
            opts = RankingOptions(mode="gpu", top_k=n, max_timed=n, tune_top=tune,
                                  reps=args.reps, warmup=args.warmup, seed=args.seed + index,
                                  task_timeout=args.task_timeout)
            try:
                result = rank_graphs(program, live, opts, pools=pools, prepared=True) \
                    if live else None
            except Exception as error:  # noqa: BLE001 - the row reports it, the others go on
                log(f"{row.name}: ranking failed: {type(error).__name__}: {error}")
                result = None
            rows_lines = row_lines(row, program, entries, result, bad)
            lines += rows_lines
            with records_path.open("a") as handle:
                handle.write("".join(json.dumps(line) + "\n" for line in rows_lines))
            if result is not None:
                log(f"{row.name}: {result.summary().splitlines()[1].strip()}")
    finally:
        pools.close()
    table = correlation_table(lines)
    (args.out / "ranking_table.txt").write_text(table + "\n")
    print(f"\n{lines[0].get('device', '?') if lines else '?'}; reps {args.reps}, "
          f"{time.monotonic() - STARTED:.0f} s; records: {records_path}")
    print(table)
    return 0


def run_superoptimize(args) -> int:
    """``superoptimize`` as a user calls it, on one row's program at suite sizes."""
    from benchmarks.suite import select

    (row,) = select([args.superoptimize], None)
    program = row.program()
    log(f"{row.name}: superoptimize, {args.time_limit:g} s of search")
    best = program.superoptimize(
        time_limit=args.time_limit, workers=args.jobs,
        ranking={"reps": args.reps, "warmup": args.warmup, "tune_top": args.tune_top},
        progress=log,
    )
    ranking = getattr(best, "ranking", None)
    print(f"\n{row.name}: superoptimize returned "
          f"{'the program unchanged' if best is program else 'a μGraph'} "
          f"({time.monotonic() - STARTED:.0f} s in all)")
    result = getattr(best, "search_result", None)
    print(result.summary() if hasattr(result, "summary") else result)
    if ranking is not None:
        print(ranking.table())
    return 0


def row_lines(row, program, entries, result, bad) -> list[dict]:
    """One JSON record per candidate of the row (excluded ones too)."""
    graphs = {e.label: e for e in entries}
    by_label = {r.label: r for r in result.records} if result is not None else {}
    out = []
    for label, entry in graphs.items():
        rec = by_label.get(label)
        data = rec.to_dict() if rec is not None else {
            "label": label, "graph_hash": entry.hash, "structure": entry.structure,
            "estimate_us": entry.estimate * 1e6, "status": "excluded",
            "reason": bad.get((row.name, label), "not ranked"),
        }
        data.update(
            row=row.name, workload=row.workload, source="library" if label.startswith("lib:")
            else "searched", program=program.structural_hash(),
            program_us=result.program_us if result else None,
            device=result.device if result else None,
            chosen=result is not None and result.chosen == label,
            graph=json.loads(entry.graph.to_json()),
        )
        out.append(data)
    return out


def finite(value) -> bool:
    return isinstance(value, (int, float)) and math.isfinite(value)


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    raise SystemExit(main())
