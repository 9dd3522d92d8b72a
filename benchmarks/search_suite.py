"""Search rows of the suite as a user would, and keep what the search found.

    python -m benchmarks.search_suite [--rows NAME ...] [--time-limit S] [--workers N]
        [--out DIR] [--cache DIR]

Each row's naive program goes through ``program.superoptimize()`` at its suite shape
(:func:`mugraph.search.api.superoptimize_graph`): the search space of the program's shape
class (:mod:`mugraph.search.space`; QK-norm attention is cut into its norms and its attention
core, each searched in its own class), all ``--workers`` cores (default: every core of this
machine), ``--time-limit`` seconds per row, the final verification of the winner spread over
the same cores. The answer is written through mugraph's result cache into ``--cache`` (default
``benchmarks/searched/cache``, content-keyed by program, inputs, GPU architecture, mugraph
version and search space): ``program.superoptimize(cache=DIR, time_limit=T)`` with ``T`` at
most the limit used here then returns exactly this row's winner without searching — that is
what the benchmark runner's headline column runs. A row is searched even when the cache has
an entry for it (the new answer replaces it).

Per row, ``<out>/<row>.json`` (``verified`` false when nothing better than the program was
found, or on an error) holds the winner (``graph``: what ``superoptimize`` returned,
with its estimate, kernel count, form, final verification, the ranking that chose it —
measured times of every candidate timed on the GPU — and its launch settings),
``alternatives`` (the search's other verified candidates, thread graphs constructed, each
re-checked in float64 and through code generation) and the search record (time, states,
units, candidates verified, the config, the hand-written μGraph's best estimate);
``<out>/<row>.log`` the same in words with the search's progress. ``<out>/summary.json``
and ``summary.md`` collect one line per row (a call that searches some rows keeps the other
rows' lines). ``NAME`` is a row
(``lora_b1``) or a workload (``lora``: both of its rows); no name means every row.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import time
import traceback
from pathlib import Path

from benchmarks.suite.mugraphs import SEARCHED_DIR, hand_written_choice
from benchmarks.suite.rows import ROWS, Row, select
from mugraph.cache import ResultCache
from mugraph.search.api import superoptimize_graph
from mugraph.search.driver import default_cost, reference_recheck
from mugraph.search.forms import custom_kernel_count, describe_form, is_split_form, structure_key
from mugraph.search.fusion import construct_thread_graphs
from mugraph.search.partition import stitch

CACHE_DIR = SEARCHED_DIR / "cache"
RECHECK_LIMIT = 1e-9  # float64 re-check: equivalent graphs differ by rounding only
PROGRESS_EVERY = 25  # progress lines kept in the log: every n-th and the last
MAX_ALTERNATIVES = 24  # alternatives kept per row: the best estimates and one per structure


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


def hand_estimate(row: Row) -> tuple[float | None, str]:
    """The best estimate (µs) among the row's hand-written μGraphs (every tiling the runner
    screens), and its label."""
    try:
        choice = hand_written_choice(row)
    except Exception:  # noqa: BLE001 - no hand-written μGraph at these sizes
        return None, ""
    best = (None, "")
    for label, graph in choice.candidates or ((choice.label, choice.graph),):
        if graph is None:
            continue
        est = default_cost(graph) * 1e6
        if best[0] is None or est < best[0]:
            best = (est, label)
    return best


def _codegen(graph) -> str:
    """Whether code generation accepts the graph (kernels are generated, not loaded)."""
    from mugraph.runtime.compiled import compile_graph

    try:
        compile_graph(graph, check=False)
    except Exception as error:  # noqa: BLE001
        return f"failed: {type(error).__name__}: {str(error).splitlines()[0][:200]}"
    return "ok"


def form_record(graph) -> dict:
    return {
        "est_us": round(default_cost(graph) * 1e6, 3),
        "kernels": custom_kernel_count(graph),
        "split": is_split_form(graph),
        "form": describe_form(graph),
        "structure": structure_key(graph),
    }


def check_alternative(program, graph, verification: str) -> dict:
    """A verified search candidate (thread graphs constructed) with its float64 re-check and
    code generation."""
    recheck = reference_recheck(graph, program)
    codegen = _codegen(graph)
    return {
        **form_record(graph),
        "verification": verification,
        "float_recheck_rel_err": recheck,
        "codegen": codegen,
        "verified": recheck < RECHECK_LIMIT and codegen == "ok",
        "graph": json.loads(graph.to_json()),
    }


def alternatives(program, best, workers: int = 1, recheck: bool = True) -> list[dict]:
    """The search's verified candidates other than the winner, as whole programs (for a
    partitioned program, each candidate of a part stitched with the other parts' winners),
    re-checked over ``workers`` processes (``recheck``; else listed with their estimates and
    verification only), best estimate first."""
    results = search_results(best)
    parts = getattr(best, "partitions", None)
    chosen = getattr(best, "part_graphs", None)
    seen = {best.structural_hash()}
    tasks = []
    for i, result in enumerate(results):
        for candidate in (result.candidates if result is not None else []):
            graph = construct_thread_graphs(candidate.graph)
            if parts is not None:
                graph = stitch(program, parts, [graph if j == i else g
                                                for j, g in enumerate(chosen)])
            key = graph.structural_hash()
            if key not in seen:
                seen.add(key)
                tasks.append((program, graph, str(candidate.verification)))
    out = _map(_check_task if recheck else _list_task, tasks, workers)
    out.sort(key=lambda a: a["est_us"])
    return kept_alternatives(out)


def kept_alternatives(alts: list[dict], most: int = MAX_ALTERNATIVES) -> list[dict]:
    """The best of each distinct structure, then the best estimates, ``most`` in all (in
    estimate order)."""
    firsts = {}
    for a in alts:
        firsts.setdefault(a["structure"], a)
    chosen = list(firsts.values())[:most]
    chosen += [a for a in alts if a not in chosen][: most - len(chosen)]
    return sorted(chosen, key=lambda a: a["est_us"])


def _check_task(task) -> dict:
    return check_alternative(*task)


def _list_task(task) -> dict:
    _, graph, verification = task
    return {**form_record(graph), "verification": verification, "verified": True,
            "float_recheck_rel_err": None, "codegen": "not checked",
            "graph": json.loads(graph.to_json())}


def _map(fn, tasks: list, workers: int) -> list:
    """``[fn(t) for t in tasks]`` over forked processes (inline for one worker)."""
    count = min(workers, len(tasks))
    if count <= 1 or "fork" not in multiprocessing.get_all_start_methods():
        return [fn(t) for t in tasks]
    with multiprocessing.get_context("fork").Pool(count) as pool:
        try:
            return pool.map(fn, tasks, chunksize=1)
        finally:
            pool.terminate()


def search_results(best) -> list:
    """The search result of each part of ``best`` (one for a program searched whole)."""
    result = getattr(best, "search_result", None)
    if result is None:
        return [None]
    return list(result.parts) if result.parts else [result]


def search_summary(best) -> dict:
    """Time, states, units and candidate counts of the search(es) behind ``best``."""
    results = search_results(best)
    done = [r for r in results if r is not None and r.config is not None]
    return {
        "elapsed_s": round(sum(r.elapsed for r in done), 1),
        "states": sum(r.stats.states for r in done),
        "units": " + ".join(f"{r.units_done}/{r.units_total}" for r in done),
        "timed_out": any(r.timed_out for r in done),
        "candidates_verified": sum(len(r.candidates) for r in done),
        "presets": [r.config.preset for r in done],
        "summary": "\n".join(r.summary() for r in done),
        "configs": [config_record(r.config) for r in done],
        "cached_parts": sum(1 for r in results if r is None),
    }


def search_row(row: Row, time_limit: float, workers: int, out: Path, cache: ResultCache,
               recheck: bool = True, ranking: dict | None = None) -> dict:
    """Search one row; write its log (always) and its JSON (when the search improved the
    program)."""
    program = row.program()
    progress: list[str] = []
    started = time.monotonic()
    hand_us, hand_label = hand_estimate(row)
    record: dict = {"row": row.name, "date": time.strftime("%Y-%m-%d"),
                    "time_limit": time_limit, "workers": workers,
                    "naive_est_us": round(default_cost(program) * 1e6, 3),
                    "hand_est_us": hand_us and round(hand_us, 3), "hand_label": hand_label,
                    "program": json.loads(program.to_json())}
    alts: list[dict] = []
    try:
        best = superoptimize_graph(program, time_limit=time_limit, workers=workers,
                                   progress=progress.append, cache=cache, cache_lookup=False,
                                   ranking=ranking)
        record.update(search_summary(best))
        record["wall_s"] = round(time.monotonic() - started, 1)
        improved = best is not program
        record.update(improved=improved, verified=improved)
        if improved:
            record.update(form_record(best))
            record["verification"] = str(getattr(best, "verification", "")) or "; ".join(
                str(getattr(g, "verification", "")) for g in getattr(best, "part_graphs", []))
            record["graph"] = json.loads(best.to_json())
            record["float_recheck_rel_err"] = reference_recheck(best, program)
            ranking = getattr(best, "ranking", None)
            record["ranking"] = ranking.to_dict() if ranking is not None else None
            record["launch"] = {str(i): [c.num_warps, c.num_stages]
                                for i, c in (getattr(best, "launch_settings", None) or {}).items()}
            alts = alternatives(program, best, workers, recheck)
            record["alternatives_total"] = len(getattr(best.search_result, "candidates", []))
        record["verdict"] = "verified" if improved else "nothing better than the program"
    except Exception as error:  # noqa: BLE001 - a failing row is logged, the others go on
        record.update(verified=False, verdict="error",
                      error=f"{type(error).__name__}: {error}",
                      wall_s=round(time.monotonic() - started, 1))
        progress.append(traceback.format_exc())
    record["checked_s"] = round(time.monotonic() - started, 1)
    record["alternatives"] = alts
    out.mkdir(parents=True, exist_ok=True)
    write_log(out / f"{row.name}.log", record, progress)
    # written whatever the verdict: the runner reads the budget a row was searched with here
    (out / f"{row.name}.json").write_text(json.dumps(record, indent=1))
    return record


def write_log(path: Path, record: dict, progress: list[str]) -> None:
    lines = [f"# search of {record['row']} ({time.strftime('%Y-%m-%d %H:%M:%S')})", ""]
    lines += [record.get("summary", ""), "", f"verdict: {record['verdict']}"]
    for key in ("wall_s", "checked_s", "elapsed_s", "states", "units", "timed_out",
                "candidates_verified", "presets", "cached_parts",
                "naive_est_us", "hand_est_us", "hand_label", "est_us", "kernels", "form",
                "structure", "verification", "error"):
        if key in record:
            lines.append(f"{key}: {record[key]}")
    for i, config in enumerate(record.get("configs", [])):
        lines += ["", f"config {i}: " + json.dumps(config, sort_keys=True)]
    shown = [p for i, p in enumerate(progress) if i % PROGRESS_EVERY == 0 or i == len(progress) - 1]
    lines += ["", f"progress (every {PROGRESS_EVERY}th line):", *shown, "", "alternatives:"]
    for i, alt in enumerate(record.get("alternatives", [])):
        lines.append(f"  {i}: est {alt['est_us']} us, {alt['form']}; {alt['verification']}; "
                     f"float64 re-check {_g(alt['float_recheck_rel_err'])}; "
                     f"codegen {alt['codegen']}")
    path.write_text("\n".join(lines) + "\n")


SUMMARY_KEYS = ("row", "verdict", "wall_s", "elapsed_s", "states", "units",
                "candidates_verified", "naive_est_us", "hand_est_us", "est_us", "kernels",
                "split", "form")


def summary_line(record: dict) -> dict:
    line = {k: record.get(k) for k in SUMMARY_KEYS}
    line["alternatives"] = len(record.get("alternatives", []))
    line["alternative_structures"] = len({a["structure"] for a in record.get("alternatives", [])})
    line["split_alternative"] = any(a["split"] for a in record.get("alternatives", []))
    hand, est = record.get("hand_est_us"), record.get("est_us")
    line["vs_hand"] = round(hand / est, 3) if hand and est else None
    return line


def merged_summary(out: Path, lines: list[dict]) -> list[dict]:
    """The summary lines of ``out`` with this call's ``lines`` in place of those rows' earlier
    lines (a call that searches some rows keeps the others'), in table order."""
    path = out / "summary.json"
    by_row: dict[str, dict] = {}
    if path.exists():
        try:
            by_row = {ln["row"]: ln for ln in json.loads(path.read_text())}
        except (ValueError, KeyError, TypeError):
            by_row = {}
    by_row.update({ln["row"]: ln for ln in lines})
    order = {name: i for i, name in enumerate(ROWS)}
    return sorted(by_row.values(), key=lambda ln: order.get(ln["row"], len(order)))


def write_summary(out: Path, lines: list[dict]) -> None:
    """Write ``summary.json`` and ``summary.md``: this call's rows merged into the earlier
    calls' (:func:`merged_summary`)."""
    lines = merged_summary(out, lines)
    (out / "summary.json").write_text(json.dumps(lines, indent=1))
    head = ("| row | search s | states | verified | est µs | hand-written est µs | est vs hand | "
            "kernels | split | alternatives (structures) | split alternative |")
    rows = [head, "|" + " --- |" * 11]
    for ln in lines:
        rows.append(
            f"| {ln['row']} | {ln['elapsed_s']} | {ln['states']} | {ln['candidates_verified']} | "
            f"{ln['est_us']} | {_round(ln['hand_est_us'])} | {ln['vs_hand']} | {ln['kernels']} | "
            f"{ln['split']} | {ln['alternatives']} ({ln['alternative_structures']}) | "
            f"{ln['split_alternative']} |")
    (out / "summary.md").write_text("\n".join(rows) + "\n")


def _g(x) -> str:
    return "not run" if x is None else f"{x:.3g}"


def _round(x):
    return None if x is None else round(x, 2)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", nargs="*", default=[])
    parser.add_argument("--time-limit", type=float, default=30.0)
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--out", type=Path, default=SEARCHED_DIR)
    parser.add_argument("--cache", type=Path, default=CACHE_DIR)
    parser.add_argument("--no-recheck", dest="recheck", action="store_false",
                        help="list the alternatives without their float64 re-check and "
                             "code generation (the winner is checked by the GPU ranking)")
    parser.add_argument("--max-timed", type=int, default=None,
                        help="GPU ranking: candidates timed at most (RankingOptions.max_timed)")
    parser.add_argument("--tune-top", type=int, default=None,
                        help="GPU ranking: fastest candidates whose launch is tuned")
    args = parser.parse_args(argv)
    cache = ResultCache(args.cache)
    ranking = {k: v for k, v in (("max_timed", args.max_timed), ("tune_top", args.tune_top))
               if v is not None} or None
    lines = []
    for row in select(args.rows):
        record = search_row(row, args.time_limit, args.workers, args.out, cache, args.recheck,
                            ranking)
        lines.append(summary_line(record))
        print(json.dumps(lines[-1]), flush=True)
        write_summary(args.out, lines)


if __name__ == "__main__":
    main()
