"""Run the search on rows of the suite and keep what it found, verified.

    python -m benchmarks.search_suite [--rows NAME ...] [--time-limit S] [--workers N]
        [--out DIR]

For each row: ``mugraph.search.driver.superoptimize`` on the row's naive program at its suite
sizes (the row family's config preset); then, best estimate first, each verified candidate
gets thread-graph construction, a final verification against the program (finite fields, 32
rounds), the float re-check (:func:`mugraph.search.driver.reference_recheck`, float64) and
code generation, until ``KEEP`` have passed all of them. ``<out>/<row>.log`` records the search
(summary, config, elapsed, states, progress, verdicts) whatever it found; ``<out>/<row>.json``
(the best such graph, the others as ``alternatives``, and that record) is written only when
at least one passed, and is what ``benchmarks.run`` uses (it screens the alternatives on the
GPU: the cost model often ties tilings that the GPU tells apart).
Rows run one after the other (one search at a time). ``NAME`` is a row (``lora_b1``) or a
workload (``lora``, both of its rows).
"""

from __future__ import annotations

import argparse
import json
import time
import traceback
from pathlib import Path

from benchmarks.suite.mugraphs import SEARCHED_DIR, hand_written
from benchmarks.suite.rows import Row, select
from mugraph.search.driver import default_cost, reference_recheck, superoptimize
from mugraph.search.fusion import construct_thread_graphs
from mugraph.search.verify import verify

DEFAULT_ROWS = ("rmsnorm_linear", "gated_mlp", "lora", "mlp_adapter", "lora_llama7b",
                "rmsnorm_linear_llama3_8b", "gated_mlp_llama3_8b")
RECHECK_LIMIT = 1e-9  # float64 re-check: equivalent graphs differ by rounding only
PROGRESS_EVERY = 25  # progress lines kept in the log: every n-th and the last
KEEP = 6  # verified candidates kept per row (best estimate first), for the GPU to screen


def config_record(config) -> dict:
    """The search config as JSON data (frozensets sorted, enums by value)."""
    out = {}
    for name, value in vars(config).items():
        if isinstance(value, frozenset):
            value = sorted(getattr(v, "value", str(v)) for v in value)
        elif isinstance(value, tuple):
            value = [list(v) if isinstance(v, tuple) else v for v in value]
        elif not isinstance(value, (int, float, str, bool, type(None))):
            value = str(value)
        out[name] = value
    return out


def _hand_estimate(row: Row) -> float | None:
    try:
        return default_cost(hand_written(row)) * 1e6
    except Exception:  # noqa: BLE001 - no hand-written μGraph at these sizes
        return None


def _codegen(graph) -> str:
    """Whether code generation accepts the graph (kernels are generated, not loaded)."""
    from mugraph.runtime.compiled import compile_graph

    try:
        compile_graph(graph, check=False)
    except Exception as error:  # noqa: BLE001
        return f"failed: {type(error).__name__}: {str(error).splitlines()[0][:200]}"
    return "ok"


def check_candidate(program, candidate, delta: float) -> dict:
    """Thread-graph construction on a search candidate, then the final checks: verification
    (32 rounds), the float64 re-check and code generation."""
    final = construct_thread_graphs(candidate.graph)
    check = verify(final, program, delta=delta, max_rounds=32)
    recheck = reference_recheck(final, program)
    return {
        "graph": final,
        "search_est_us": round(candidate.cost * 1e6, 3),
        "est_us": round(default_cost(final) * 1e6, 3),
        "search_verification": str(candidate.verification),
        "verification": str(check),
        "float_recheck_rel_err": recheck,
        "codegen": _codegen(final),
        "kernels": sum(1 for op in final.ops if op.kind.value == "customized"),
        "verified": bool(check.passed) and recheck < RECHECK_LIMIT,
    }


def finish(row: Row, program, result, keep: int = KEEP) -> tuple[dict, list[dict]]:
    """The record of a finished search and its best ``keep`` candidates that passed every
    final check (best estimate first; empty: nothing verified)."""
    record = {
        "row": row.name,
        "program": json.loads(program.to_json()),
        "preset": row.family.preset,
        "elapsed_s": round(result.elapsed, 1),
        "states": result.stats.states,
        "units": f"{result.units_done}/{result.units_total}",
        "timed_out": result.timed_out,
        "candidates_verified": len(result.candidates),
        "summary": result.summary(),
        "config": config_record(result.config),
        "naive_est_us": round(default_cost(program) * 1e6, 3),
        "hand_est_us": _hand_estimate(row),
        "verified": False,
    }
    kept, rejected = [], 0
    for candidate in result.candidates:
        if len(kept) >= keep:
            break
        checked = check_candidate(program, candidate, result.config.delta)
        if checked["verified"] and checked["codegen"] == "ok":
            kept.append(checked)
        else:
            rejected += 1
    record["final_checks_rejected"] = rejected
    if not kept:
        record["verdict"] = "nothing found" if result.best is None else "REJECTED (final checks)"
        return record, []
    best = kept[0]
    record.update({k: v for k, v in best.items() if k not in ("graph", "verified")})
    record.update(verified=True, verdict="verified", kept=len(kept))
    return record, kept


def write_log(path: Path, record: dict, progress: list[str], kept: list[dict]) -> None:
    lines = [f"# search of {record['row']} ({time.strftime('%Y-%m-%d %H:%M:%S')})", ""]
    lines += [record["summary"], "", f"verdict: {record['verdict']}"]
    for key in ("elapsed_s", "states", "units", "timed_out", "candidates_verified",
                "naive_est_us", "hand_est_us", "search_est_us", "est_us", "search_verification",
                "verification", "float_recheck_rel_err", "codegen", "kernels", "kept",
                "final_checks_rejected", "error"):
        if key in record:
            lines.append(f"{key}: {record[key]}")
    lines += ["", "config: " + json.dumps(record.get("config", {}), sort_keys=True), ""]
    shown = [p for i, p in enumerate(progress) if i % PROGRESS_EVERY == 0 or i == len(progress) - 1]
    lines += [f"progress (every {PROGRESS_EVERY}th line):", *shown, ""]
    for i, c in enumerate(kept):
        lines += [f"candidate {i} (est {c['est_us']} us; {c['verification']}; float64 re-check "
                  f"{c['float_recheck_rel_err']:.3g}; thread graphs constructed):", str(c["graph"]),
                  ""]
    path.write_text("\n".join(lines) + "\n")


def search_row(row: Row, time_limit: float, workers: int, out: Path) -> dict:
    """Search one row; write its log (always) and its μGraph (when verified)."""
    program = row.program()
    progress: list[str] = []
    started = time.monotonic()
    try:
        result = superoptimize(program, preset=row.family.preset, time_limit=time_limit,
                               workers=workers, progress=progress.append)
        record, kept = finish(row, program, result)
    except Exception as error:  # noqa: BLE001 - a failing row is logged, the others go on
        record = {"row": row.name, "verified": False, "summary": "search failed",
                  "verdict": "error", "error": f"{type(error).__name__}: {error}",
                  "elapsed_s": round(time.monotonic() - started, 1)}
        progress.append(traceback.format_exc())
        kept = []
    record["date"] = time.strftime("%Y-%m-%d")
    out.mkdir(parents=True, exist_ok=True)
    write_log(out / f"{row.name}.log", record, progress, kept)
    if kept:
        doc = {**record, "graph": json.loads(kept[0]["graph"].to_json()),
               "alternatives": [_alternative(c) for c in kept[1:]]}
        (out / f"{row.name}.json").write_text(json.dumps(doc, indent=1))
    return record


def _alternative(checked: dict) -> dict:
    return {**{k: v for k, v in checked.items() if k != "graph"},
            "graph": json.loads(checked["graph"].to_json())}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", nargs="*", default=list(DEFAULT_ROWS))
    parser.add_argument("--time-limit", type=float, default=120.0)
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--out", type=Path, default=SEARCHED_DIR)
    args = parser.parse_args(argv)
    for row in select(args.rows):
        record = search_row(row, args.time_limit, args.workers, args.out)
        keys = ("row", "verdict", "elapsed_s", "states", "candidates_verified", "kept",
                "naive_est_us", "hand_est_us", "est_us")
        print(json.dumps({k: record.get(k) for k in keys}), flush=True)


if __name__ == "__main__":
    main()
