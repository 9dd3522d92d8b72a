"""Where a persistent step's levels spend their time, from a trace's raw stamps (CPU only).

    python benchmarks/trace_levels.py TRACE.npz [--levels 22 27]

``TRACE.npz`` is what ``bench_persistent.py --trace`` writes beside each summary: per task its
globaltimer stamps (start, after the wait, end, and since the thirty-second session after its
stores, before its triggers), level (depth in the task graph), kind,
program and blocks. Prints, for the chosen levels, the level's time (from the previous
level's last end to its own), each task's wake (after the wait) and work (from the wake to
its end) measured from the previous level's last end, and (traces with a fourth stamp, after
the task's stores) the time its triggers took; then, per kind of task, the time from
the previous task's end on the same program to the task's start (the dispatcher's gap), the
wake after both the task and its producers were done, and the share of tasks that started
after their producers' level had ended.
"""

from __future__ import annotations

import argparse

import numpy as np


def load(path: str) -> dict:
    z = np.load(path)
    # globaltimer nanoseconds are about 1.8e18: subtracted as floats they keep 256 ns steps,
    # so the first stamp is subtracted in int64
    raw = z["stamps"]
    stamps = (raw - raw[:, 0].min()).astype(np.float64) / 1e3  # µs
    return {
        "start": stamps[:, 0],
        "woke": stamps[:, 1],
        "end": stamps[:, 2],
        # after the stores, before the triggers (traces since the thirty-second session)
        "stored": stamps[:, 3] if stamps.shape[1] > 3 else None,
        "depth": z["depth"],
        "kind": z["kind"],
        "blocks": z["blocks"],
        "program": z["program"],
    }


def level_ends(t: dict) -> np.ndarray:
    return np.array([t["end"][t["depth"] == d].max() for d in range(int(t["depth"].max()) + 1)])


def level_rows(t: dict, levels: range) -> list[str]:
    ends = level_ends(t)
    stored = t["stored"]
    extra = stored is not None
    rows = ["| level | kinds | tasks | blocks | time | wake median / max | work median / max |"
            + (" trigger median / max |" if extra else ""),
            "| --- | --- | --- | --- | --- | --- | --- |" + (" --- |" if extra else "")]
    for d in levels:
        ix = np.where(t["depth"] == d)[0]
        before = ends[d - 1] if d else 0.0
        wake = t["woke"][ix] - before
        work = t["end"][ix] - t["woke"][ix]
        kinds = "+".join(sorted(set(t["kind"][ix])))
        signal = ""
        if stored is not None:  # the triggers' share of the work
            trig = t["end"][ix] - stored[ix]
            signal = f" {np.median(trig):.2f} / {trig.max():.2f} |"
        rows.append(
            f"| {d} | {kinds} | {len(ix)} | {int(t['blocks'][ix].sum())} | "
            f"{ends[d] - before:.2f} | {np.median(wake):.2f} / {wake.max():.2f} | "
            f"{np.median(work):.2f} / {work.max():.2f} |{signal}"
        )
    return rows


def period_rows(t: dict, first: int, period: int) -> list[str]:
    """The levels from ``first`` on, taken ``period`` at a time (a decoder layer's levels):
    per position in the period, the sum and median of its levels' times and the median of
    their tasks' median wakes, over every whole period."""
    ends = level_ends(t)
    count = (len(ends) - first) // period
    rows = ["| position | kinds | levels | time sum | time median | wake median |",
            "| --- | --- | --- | --- | --- | --- |"]
    for j in range(period):
        levels = [first + j + period * i for i in range(count)]
        times = [ends[d] - ends[d - 1] for d in levels]
        wakes = [np.median(t["woke"][t["depth"] == d] - ends[d - 1]) for d in levels]
        kinds = "+".join(sorted(set(t["kind"][t["depth"] == levels[0]])))
        rows.append(f"| {j} | {kinds} | {count} | {sum(times):.1f} | {np.median(times):.2f} | "
                    f"{np.median(wakes):.2f} |")
    return rows


def previous_ends(t: dict) -> np.ndarray:
    """The end of the task before each one on its program (NaN for a program's first)."""
    prev = np.full(len(t["start"]), np.nan)
    for p in np.unique(t["program"]):
        ix = np.where(t["program"] == p)[0]
        ix = ix[np.argsort(t["start"][ix])]
        prev[ix[1:]] = t["end"][ix[:-1]]
    return prev


def dispatch_rows(t: dict) -> list[str]:
    ends = level_ends(t)
    fired = np.array([ends[d - 1] if d else 0.0 for d in t["depth"]])
    prev = previous_ends(t)
    rows = ["| kind | gap median / p90 | wake after ready median / p90 | started after fire |",
            "| --- | --- | --- | --- |"]
    for kind in sorted(set(t["kind"])):
        ix = np.where((t["kind"] == kind) & ~np.isnan(prev))[0]
        if not len(ix):
            continue
        gap = t["start"][ix] - prev[ix]
        late = t["woke"][ix] - np.maximum(t["start"][ix], fired[ix])
        after = float(np.mean(t["start"][ix] > fired[ix]))
        rows.append(
            f"| {kind} | {np.median(gap):.2f} / {np.percentile(gap, 90):.2f} | "
            f"{np.median(late):.2f} / {np.percentile(late, 90):.2f} | {after:.2f} |"
        )
    return rows


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("trace")
    p.add_argument("--levels", type=int, nargs=2, default=(22, 27), metavar=("FIRST", "LAST"))
    p.add_argument("--period", type=int, nargs=2, default=None, metavar=("FIRST", "LEVELS"),
                   help="also sum the levels from FIRST on by position in every LEVELS (a "
                   "decoder layer's: 1 6 for the decoders of bench_persistent)")
    args = p.parse_args(argv)
    t = load(args.trace)
    print(f"{args.trace}: step {t['end'].max():.1f} µs, {int(t['depth'].max()) + 1} levels")
    print("\n".join(level_rows(t, range(args.levels[0], args.levels[1] + 1))))
    if args.period:
        print()
        print("\n".join(period_rows(t, *args.period)))
    print()
    print("\n".join(dispatch_rows(t)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
