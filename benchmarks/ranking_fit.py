"""How well the cost model ranks μGraphs, from GPU measurements, and fitting its constants.

    python benchmarks/ranking_fit.py RECORDS.jsonl[.gz] [--fit] [--rounds N]
    python benchmarks/ranking_fit.py benchmarks/searched [--fit]   # the suite searches' rankings

RECORDS are what ``benchmarks/bench_ranking.py`` writes: one line per candidate with its row,
graph (JSON), estimate and measured medians. This prints, per row, the rank correlation
(Spearman) between the cost model's estimate and the measured time (the default launch
settings' median, which every timed candidate has), and what choosing by estimate costs
(the measured time of the best-estimated candidate over the measured best).

``--fit`` tunes the cost model's constants (:class:`mugraph.optimize.cost_model.CostParams`)
to rank better, and reports it honestly: leave one program family out (``--by``) — for each
family (attention, rmsnorm_linear, gated_mlp, ... with all their rows), the constants are
fitted on the other families only and the held-out family's rows are scored with them — so
no row's score comes from constants fitted to its own measurements, nor to those of its
siblings at other sizes.
"""

from __future__ import annotations

import argparse
import gzip
import json
import math
import sys
from collections.abc import Callable, Sequence
from dataclasses import fields, replace
from pathlib import Path

HERE = Path(__file__).resolve().parent
if str(HERE.parent) not in sys.path:
    sys.path.insert(0, str(HERE.parent))

MIN_TIMED = 3  # rows with fewer timed candidates are not scored


# ---- statistics ------------------------------------------------------------------------------


def ranks(values: Sequence[float]) -> list[float]:
    """1-based ranks, ties sharing their average rank."""
    order = sorted(range(len(values)), key=lambda i: values[i])
    out = [0.0] * len(values)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
            j += 1
        for k in range(i, j + 1):
            out[order[k]] = (i + j) / 2 + 1
        i = j + 1
    return out


def spearman(xs: Sequence[float], ys: Sequence[float]) -> float:
    """Spearman's rank correlation (Pearson's on tie-averaged ranks); NaN when either side
    is constant (no ranking information) or fewer than two points."""
    if len(xs) < 2:
        return math.nan
    rx, ry = ranks(xs), ranks(ys)
    mx, my = sum(rx) / len(rx), sum(ry) / len(ry)
    sxy = sum((a - mx) * (b - my) for a, b in zip(rx, ry, strict=True))
    sxx = sum((a - mx) ** 2 for a in rx)
    syy = sum((b - my) ** 2 for b in ry)
    if sxx == 0 or syy == 0:
        return math.nan
    return sxy / math.sqrt(sxx * syy)


# ---- the table -------------------------------------------------------------------------------


def timed(lines: Sequence[dict]) -> list[dict]:
    return [line for line in lines if line.get("status") == "timed" and line.get("default_us")]


def by_row(lines: Sequence[dict]) -> dict[str, list[dict]]:
    rows: dict[str, list[dict]] = {}
    for line in lines:
        rows.setdefault(line["row"], []).append(line)
    return rows


def row_score(lines: Sequence[dict], estimate: Callable[[dict], float]) -> dict:
    """Spearman of estimate vs default-launch time over a row's timed candidates, and the
    cost of picking by estimate (pick's time / best time)."""
    ok = timed(lines)
    est = [estimate(line) for line in ok]
    meas = [line["default_us"] for line in ok]
    score = {"n": len(lines), "timed": len(ok), "rho": math.nan, "pick_us": None,
             "best_us": None, "regret": None}
    if not ok:
        return score
    score["rho"] = spearman(est, meas) if len(ok) >= MIN_TIMED else math.nan
    low = min(est)
    # ties among the best estimates: the pick is their first in the search's order; score
    # the mean of their times (what a tie-break without information gets on average)
    tied = [m for e, m in zip(est, meas, strict=True) if e == low]
    score["pick_us"] = sum(tied) / len(tied)
    score["best_us"] = min(meas)
    score["regret"] = score["pick_us"] / score["best_us"]
    return score


def summary_scores(lines: Sequence[dict], estimate: Callable[[dict], float]) -> dict:
    """Mean within-row Spearman (rows with >= MIN_TIMED timed; an undefined one — every
    estimate tied — counts 0), pooled Spearman over all timed candidates, and the geometric
    mean of the pick-by-estimate regret."""
    rows = by_row(lines)
    scores = {name: row_score(rs, estimate) for name, rs in rows.items()}
    scored = [s for s in scores.values() if s["timed"] >= MIN_TIMED]
    rhos = [0.0 if math.isnan(s["rho"]) else s["rho"] for s in scored]
    regrets = [s["regret"] for s in scores.values() if s["regret"]]
    ok = timed(lines)
    return {
        "rows": scores,
        "mean_rho": sum(rhos) / len(rhos) if rhos else math.nan,
        "pooled_rho": spearman([estimate(line) for line in ok], [line["default_us"]
                                                                  for line in ok]),
        "geo_regret": math.exp(sum(math.log(r) for r in regrets) / len(regrets))
        if regrets else math.nan,
        "undefined": sum(1 for s in scored if math.isnan(s["rho"])),
        "scored": len(scored),
    }


def _f(value, digits: int = 2) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return f"{value:.{digits}f}"


def correlation_table(lines: Sequence[dict], estimate: Callable[[dict], float] | None = None,
                      other: Callable[[dict], float] | None = None,
                      names: tuple[str, str] = ("before", "after")) -> str:
    """The per-row table (and the overall scores) of one estimate, or of two side by side."""
    estimate = estimate or (lambda line: line["estimate_us"])
    first = summary_scores(lines, estimate)
    second = summary_scores(lines, other) if other else None
    head = ["row", "cands", "timed", "excl"]
    if second:
        head += [f"rho {names[0]}", f"rho {names[1]}", f"pick/best {names[0]}",
                 f"pick/best {names[1]}", "best us"]
    else:
        head += ["spearman", "pick us", "best us", "pick/best", "chosen us", "program us"]
    out = [" | ".join(head), " | ".join("---" for _ in head)]
    rows = by_row(lines)
    for name, rs in rows.items():
        s = first["rows"][name]
        cells = [name, str(s["n"]), str(s["timed"]), str(s["n"] - s["timed"])]
        if second:
            t = second["rows"][name]
            cells += [_f(s["rho"]), _f(t["rho"]), _f(s["regret"]), _f(t["regret"]),
                      _f(s["best_us"], 1)]
        else:
            chosen = [r for r in rs if r.get("chosen")]
            cells += [_f(s["rho"]), _f(s["pick_us"], 1), _f(s["best_us"], 1), _f(s["regret"]),
                      _f(chosen[0].get("measured_us"), 1) if chosen else "-",
                      _f(rs[0].get("program_us"), 1)]
        out.append(" | ".join(cells))
    out.append("")
    for label, scores in ((names[0] if second else "estimate", first),
                          (names[1], second)):
        if scores is None:
            continue
        out.append(f"{label}: mean within-row Spearman {_f(scores['mean_rho'])} over "
                   f"{scores['scored']} rows ({scores['undefined']} with every estimate tied, "
                   f"counted 0); pooled Spearman {_f(scores['pooled_rho'])}; "
                   f"pick-by-estimate / best, geometric mean {_f(scores['geo_regret'], 3)}")
    return "\n".join(out)


# ---- fitting the cost model ------------------------------------------------------------------


def read_lines(path: Path) -> list[dict]:
    """Records of a ``bench_ranking.py`` file, or, for a folder, of the GPU rankings kept with
    the suite's searches (:func:`searched_lines`)."""
    if path.is_dir():
        return searched_lines(path)
    opener = gzip.open if str(path).endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8") as handle:
        return [json.loads(line) for line in handle if line.strip()]


def searched_lines(folder: Path) -> list[dict]:
    """Records from ``benchmarks/searched/ROW.json`` (``search_suite.py``): each row's GPU
    ranking records joined with the graphs of its kept alternatives by structural hash. A
    timed candidate whose graph was not kept (the file keeps the first alternatives only) is
    left out, so a row scores fewer candidates than its ranking timed."""
    from mugraph.ir.serialize import from_json

    lines = []
    for path in sorted(folder.glob("*.json")):
        data = json.loads(path.read_text(encoding="utf-8"))
        ranking = data.get("ranking") if isinstance(data, dict) else None
        if not isinstance(ranking, dict) or not ranking.get("records"):
            continue
        graphs = {}
        for alternative in data.get("alternatives", []):
            graphs[from_json(alternative["graph"]).structural_hash()] = alternative["graph"]
        for record in ranking["records"]:
            if record.get("graph_hash") in graphs:
                lines.append({**record, "row": data["row"], "graph": graphs[record["graph_hash"]],
                              "workload": data["row"].rsplit("_b", 1)[0]})  # fmt: skip
    return lines


def graph_of(line: dict, memo: dict):
    from mugraph.ir.serialize import from_json

    key = line["graph_hash"]
    if key not in memo:
        memo[key] = from_json(json.dumps(line["graph"]))
    return memo[key]


def estimator(params, memo: dict) -> Callable[[dict], float]:
    from mugraph.optimize.cost_model import estimate

    cache: dict[str, float] = {}

    def est(line: dict) -> float:
        key = line["graph_hash"]
        if key not in cache:
            cache[key] = estimate(graph_of(line, memo), params=params).seconds * 1e6
        return cache[key]

    return est


# each fitted constant: candidate values tried by coordinate search (the defaults included)
SEARCH_GRID: dict[str, tuple[float, ...]] = {
    "iteration_latency": (0.05e-6, 0.15e-6, 0.3e-6, 0.6e-6, 1.0e-6),
    "chain_latency": (0.0, 0.1e-6, 0.2e-6, 0.4e-6),
    "reduction_latency": (0.0, 0.3e-6, 1.0e-6, 2.0e-6),
    "register_elements_per_thread": (64, 96, 128, 192, 256),
    "spill_exponent": (1.0, 2.0, 3.0, 4.0),
    "load_elements_per_thread": (128, 192, 256, 384),
    "load_exponent": (0.0, 0.5, 1.0),
    "sm_burst": (1.5, 3.0, 6.0),
    "l2_bandwidth_ratio": (1.5, 2.5, 4.0),
}


def objective(lines: Sequence[dict], params, memo: dict) -> float:
    scores = summary_scores(lines, estimator(params, memo))
    return scores["mean_rho"] - 0.25 * math.log(scores["geo_regret"])


def hand_set_params():
    """The constants the cost model had before any fit (hand-set H100 figures, the new terms
    off): every fit starts from them, so a held-out fold never starts from constants that
    were fitted with the rows it holds out."""
    from mugraph.optimize.cost_model import CostParams

    return CostParams(iteration_latency=0.15e-6, chain_latency=0.0, reduction_latency=0.0,
                      register_elements_per_thread=256, spill_exponent=1.0,
                      load_elements_per_thread=256, load_exponent=0.0)


def fit(lines: Sequence[dict], memo: dict, rounds: int = 2, start=None):
    """Coordinate search over SEARCH_GRID maximizing the mean within-row Spearman (minus a
    small term for the pick-by-estimate regret) on ``lines``, from ``start`` (default: the
    hand-set constants)."""
    best = start or hand_set_params()
    best_score = objective(lines, best, memo)
    names = {f.name for f in fields(best)}
    for _ in range(rounds):
        improved = False
        for name, values in SEARCH_GRID.items():
            if name not in names:
                continue
            for value in values:
                trial = replace(best, **{name: value})
                score = objective(lines, trial, memo)
                if score > best_score + 1e-9:
                    best, best_score, improved = trial, score, True
        if not improved:
            break
    return best, best_score


def family_of(row: str) -> str:
    """The program family of a suite row (attention, rmsnorm_linear, ...)."""
    from benchmarks.suite import select

    if not FAMILIES:
        FAMILIES.update({r.name: r.family.name for r in select([], None)})
    return FAMILIES.get(row, row)


FAMILIES: dict[str, str] = {}


def leave_one_group_out(lines: Sequence[dict], memo: dict, rounds: int,
                        group: Callable[[dict], str]) -> dict[str, float]:
    """{row + graph hash: estimate (µs)} with each group's estimates from constants fitted
    on the other groups only."""
    groups = sorted({group(line) for line in lines})
    held: dict[str, float] = {}
    for name in groups:
        train = [line for line in lines if group(line) != name]
        params, _ = fit(train, memo, rounds)
        est = estimator(params, memo)
        for line in lines:
            if group(line) == name:
                held[line["row"] + line["graph_hash"]] = est(line)
        print(f"held out {name}: fitted {changed(params)}", file=sys.stderr, flush=True)
    return held


def changed(params) -> str:
    """The constants of ``params`` that differ from the hand-set ones."""
    base = hand_set_params()
    diffs = [f"{f.name}={getattr(params, f.name):g}" for f in fields(params)
             if getattr(params, f.name) != getattr(base, f.name)]
    return ", ".join(diffs) or "the hand-set constants"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("records", type=Path)
    parser.add_argument("--fit", action="store_true", help="fit, leave one workload out")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--by", choices=["family", "workload", "row"], default="family",
                        help="what is held out together (default: the program family)")
    args = parser.parse_args(argv)
    lines = read_lines(args.records)
    memo: dict = {}
    from mugraph.optimize.cost_model import DEFAULT_PARAMS

    recorded = lambda line: line["estimate_us"]  # noqa: E731 - the estimate when measured
    current = estimator(DEFAULT_PARAMS, memo)
    print("the estimates recorded with the measurements against this cost model's "
          "(in-sample when its constants were fitted to these records):")
    print(correlation_table(lines, recorded, current, ("recorded", "current")))
    if args.fit:
        group = (lambda line: family_of(line["row"])) if args.by == "family" else (
            lambda line: line[args.by])
        held = leave_one_group_out(lines, memo, args.rounds, group)
        print(f"\nleave one {args.by} out (each {args.by}'s rows scored with constants fitted "
              f"on the other {args.by}s only):")
        print(correlation_table(lines, recorded,
                                lambda line: held[line["row"] + line["graph_hash"]],
                                ("recorded", "held-out fit")))
        params, score = fit(lines, memo, args.rounds)
        print(f"\nfitted on every row (objective {score:.3f}): {changed(params)}")
        print(correlation_table(lines, recorded, estimator(params, memo),
                                ("recorded", "fit on all")).splitlines()[-1])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
