"""The runner's table (text and markdown) and bar chart."""

from __future__ import annotations

import math
from pathlib import Path

BASELINES = (("eager_us", "eager"), ("compile_us", "compile"),
             ("autotune_us", "max-autotune"), ("sdpa_us", "SDPA"))


def finite(value) -> bool:
    return isinstance(value, (int, float)) and math.isfinite(value)


def summarize(rec: dict) -> dict:
    """Adds best baseline, speedup and ratios to the floor to a row's record (in place)."""
    base = [(rec[k], name) for k, name in BASELINES if finite(rec.get(k))]
    if base:
        rec["best_baseline_us"], rec["best_baseline"] = min(base)
    mg, best, floor = rec.get("mugraph_us"), rec.get("best_baseline_us"), rec.get("floor_us")
    rec["speedup"] = best / mg if finite(mg) and finite(best) else None
    rec["mugraph_vs_floor"] = mg / floor if finite(mg) and finite(floor) and floor else None
    rec["baseline_vs_floor"] = best / floor if finite(best) and finite(floor) and floor else None
    return rec


def suite_summary(records: list[dict]) -> str:
    """One line: the geometric mean of the speedups over the rows that have one, how many
    rows are at or above 1.0x, the attention rows against SDPA, and the rows without a
    mugraph figure."""
    speedups = [r["speedup"] for r in records if finite(r.get("speedup"))]
    if not speedups:
        return "no row has a mugraph figure and a baseline"
    geo = math.exp(sum(math.log(x) for x in speedups) / len(speedups))
    at_least = sum(1 for x in speedups if x >= 1.0)
    sdpa = [r for r in records if finite(r.get("sdpa_us")) and finite(r.get("mugraph_us"))]
    beat_sdpa = sum(1 for r in sdpa if r["mugraph_us"] <= r["sdpa_us"])
    missing = [r["row"] for r in records if not finite(r.get("mugraph_us"))]
    return (f"geometric mean speedup over the best baseline {geo:.2f}x over {len(speedups)} "
            f"rows; {at_least} at or above 1.0x; attention rows at or below SDPA: {beat_sdpa} "
            f"of {len(sdpa)}; no mugraph figure: {', '.join(missing) or 'none'}")


def _num(value, digits: int = 1) -> str:
    return f"{value:.{digits}f}" if finite(value) else "-"


def _ratio(value) -> str:
    return f"{value:.2f}x" if finite(value) else "-"


def gpu_cells(rec: dict) -> list[str]:
    return [
        rec["row"], str(rec["b"]),
        *(_num(rec.get(k)) for k, _ in BASELINES),
        _num(rec.get("mugraph_us")), rec.get("source", "?"),
        _ratio(rec.get("speedup")), _num(rec.get("hand_us")), _num(rec.get("floor_us")),
        _ratio(rec.get("mugraph_vs_floor")), rec.get("status", ""),
    ]


GPU_HEAD = ["row", "b", "eager", "compile", "max-autotune", "SDPA", "mugraph", "source",
            "speedup", "hand-written (reference)", "floor", "mugraph/floor", "status / notes"]
CPU_HEAD = ["row", "b", "source", "small-shape check", "rel err", "naive est", "μGraph est",
            "est speedup", "floor (nominal)", "notes"]


def cpu_cells(rec: dict) -> list[str]:
    est_naive, est_mg = rec.get("naive_est_us"), rec.get("mugraph_est_us")
    speed = est_naive / est_mg if finite(est_naive) and finite(est_mg) else None
    err = rec.get("rel_err")
    return [
        rec["row"], str(rec["b"]), rec.get("source", "?"), rec.get("check", ""),
        f"{err:.1e}" if finite(err) else ("inf" if err is not None else "-"),
        _num(est_naive), _num(est_mg), _ratio(speed), _num(rec.get("floor_us")),
        rec.get("status", ""),
    ]


def text_table(head: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h)
              for i, h in enumerate(head)]
    widths[-1] = 0
    lines = ["  ".join(h.ljust(w) for h, w in zip(head, widths, strict=True))]
    for r in rows:
        lines.append("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)))
    return "\n".join(lines)


def markdown_table(head: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    lines += ["| " + " | ".join(c.replace("|", "/") for c in r) + " |" for r in rows]
    return "\n".join(lines)


def plot(records: list[dict], path: Path) -> str:
    """A bar chart of every row's times (log scale, µs) with its floor; returns a note (the
    file written, or why not)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "matplotlib is not installed: no chart"
    series = [*BASELINES, ("mugraph_us", "mugraph")]
    rows = [r for r in records if any(finite(r.get(k)) for k, _ in series)]
    if not rows:
        return "nothing timed: no chart"
    height = 0.8 / len(series)
    fig, ax = plt.subplots(figsize=(11, 0.55 * len(rows) + 1.5))
    for j, (key, label) in enumerate(series):
        ys = [i + j * height for i in range(len(rows))]
        xs = [r.get(key) if finite(r.get(key)) else 0 for r in rows]
        ax.barh(ys, xs, height=height, label=label)
    for i, r in enumerate(rows):
        if finite(r.get("floor_us")):
            ax.plot([r["floor_us"]] * 2, [i - height / 2, i + 0.8 - height / 2], "k--", lw=1)
    ax.set_yticks([i + 0.4 - height / 2 for i in range(len(rows))])
    ax.set_yticklabels([f"{r['row']} ({r.get('source', '?')})" for r in rows], fontsize=8)
    ax.invert_yaxis()
    ax.set_xscale("log")
    ax.set_xlabel("µs (median, L2 flushed; dashed: floor)")
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return f"chart: {path}"
