"""Where a parallel search's wall time goes, item by item (issue 16): how many workers were
busy in each slice of the search, what ran in its tail, and the start's timeline.

    MUGRAPH_VERIFY_THREADS=1 python benchmarks/probe_search_timeline.py --workers 16 \
        [--cell gqa_b1] [--repeat 2] [--json FILE] [--slice SECONDS]

Each run is one complete ``superoptimize`` call of a cell of ``bench_scaling.py`` on the local
pool; every item's result is recorded as the driver takes it (worker, start, seconds, unit,
region, handed-back regions). Printed per run: the phases and the start log, the busy workers
per 0.25 s of the search, the idle worker-seconds before the first item, between items and
after each worker's last item, and the items that ran in the tail (after the queue first ran
dry), longest first. Repeats run in one process (the later ones find the pool's zygote
started and the e-graph library imported): run the script again for cold starts.
``--slice`` sets ``pool.SLICE_SECONDS`` (how long a worker runs an item before a hungry pool
has it hand the rest back).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BIN_S = 0.25


def run(cell: str, workers: int) -> dict:
    """One complete search; its record (phases, log, items)."""
    from benchmarks.bench_scaling import cell_program
    from mugraph.search import driver

    program, options = cell_program(cell)
    items: list[dict] = []
    take = driver._Search._take_result

    def recording(self, result, queue):
        items.append({
            "worker": result.worker,
            "began": result.began - self.started_wall,
            "seconds": result.seconds,
            "unit": result.item.unit_key,
            "kernels": result.item.kernels,
            "region": list(result.item.region),
            "rest": len(result.rest),
            "blocked": result.blocked,
            "found": len(result.found),
            "taken": time.time() - self.started_wall,
        })  # fmt: skip
        return take(self, result, queue)

    driver._Search._take_result = recording
    try:
        started = time.monotonic()
        result = driver.superoptimize(program, workers=workers, time_limit=600, **options)
        seconds = time.monotonic() - started
    finally:
        driver._Search._take_result = take
    return {
        "cell": cell,
        "workers": workers,
        "seconds": round(seconds, 3),
        "complete": result.units_done == result.units_total,
        "phases": {k: round(v, 3) for k, v in result.phases.items()},
        "tail_s": round(result.tail_seconds, 3),
        "log": list(result.log),
        "items": items,
    }


def summary(record: dict) -> list[str]:
    """The printed lines of one run."""
    items, workers = record["items"], record["workers"]
    end = max(i["began"] + i["seconds"] for i in items)
    lines = [f"{record['cell']} on {workers} workers: {record['seconds']:.2f} s, phases "
             + ", ".join(f"{k} {v:.2f}" for k, v in record["phases"].items())]  # fmt: skip
    lines += [f"  {line}" for line in record["log"] if "workers loaded" in line]
    by_worker: dict[str, list[dict]] = {}
    for i in items:
        by_worker.setdefault(i["worker"], []).append(i)
    first = min(i["began"] for i in items)
    before = sum(min(i["began"] for i in mine) - first for mine in by_worker.values())
    between = after = 0.0
    for mine in by_worker.values():
        mine.sort(key=lambda i: i["began"])
        for a, b in zip(mine, mine[1:], strict=False):
            between += max(0.0, b["began"] - a["began"] - a["seconds"])
        after += end - (mine[-1]["began"] + mine[-1]["seconds"])
    busy = sum(i["seconds"] for i in items)
    lines.append(f"  first item at {first:.3f} s, last end at {end:.3f} s; busy {busy:.1f} "
                 f"worker-s; idle after the first item: before a worker's first "
                 f"{before:.2f}, between items {between:.2f} ({len(items)} items), after a "
                 f"worker's last {after:.2f} worker-s")  # fmt: skip
    bins = [0.0] * (int(end / BIN_S) + 1)
    for i in items:
        t, stop = i["began"], i["began"] + i["seconds"]
        while t < stop:
            b = int(t / BIN_S)
            edge = min(stop, (b + 1) * BIN_S)
            bins[b] += edge - t
            t = edge
    lines.append("  busy workers per 0.25 s: " + " ".join(f"{v / BIN_S:.0f}" for v in bins))
    dry = end - record["tail_s"]
    tail = sorted((i for i in items if i["began"] + i["seconds"] > dry),
                  key=lambda i: -i["seconds"])  # fmt: skip
    lines.append(f"  tail from {dry:.2f} s: {len(tail)} items ran in it; the longest:")
    for i in tail[:8]:
        lines.append(f"    {i['seconds']:.3f} s from {i['began']:.3f}, {i['kernels']} kernels, "
                     f"region {i['region']}, handed back {i['rest']}"
                     f"{' (blocked)' if i['blocked'] else ''}, found {i['found']}")  # fmt: skip
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cell", default="gqa_b1")
    parser.add_argument("--workers", type=int, default=16)
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--slice", type=float)
    args = parser.parse_args()
    os.environ.setdefault("MUGRAPH_VERIFY_THREADS", "1")
    sys.path.insert(0, str(ROOT))
    if args.slice is not None:
        from mugraph.search import pool

        pool.SLICE_SECONDS = args.slice
    records = [run(args.cell, args.workers) for _ in range(args.repeat)]
    if args.json:
        args.json.write_text(json.dumps(records))
    for record in records:
        print("\n".join(summary(record)))


if __name__ == "__main__":
    main()
