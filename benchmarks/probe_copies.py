"""How fast one core searches when every core searches: ``N`` copies of the same one-worker
search, each in its own process, started together (issue 16).

    python benchmarks/probe_copies.py [--cell gqa_b1] [--copies 1 2 16] [--cap 120]

A search on ``N`` workers cannot beat ``1/N`` of the one-worker time if a core, with all the
others busy, runs slower than when it runs alone: this measures that with no pool at all
(independent processes, nothing shared, no work handed around). Each copy runs
``benchmarks/bench_scaling.py --one CELL local 1`` (the inline search, one verifier thread).
Printed per copy count: the copies' seconds and busy seconds (min / median / max), their
median against one copy's, and the CPU topology Linux reports.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def run_copies(cell: str, copies: int, cap: float) -> list[dict]:
    env = dict(os.environ, MUGRAPH_VERIFY_THREADS="1", PYTHONUNBUFFERED="1")
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    command = [sys.executable, str(ROOT / "benchmarks" / "bench_scaling.py"), "--one", cell,
               "local", "1", "--cap", str(cap)]  # fmt: skip
    running = [subprocess.Popen(command, env=env, stdout=subprocess.PIPE, text=True)
               for _ in range(copies)]  # fmt: skip
    records = []
    for process in running:
        out, _ = process.communicate(timeout=cap + 120)
        lines = [line for line in out.splitlines() if line.startswith("{")]
        records.append(json.loads(lines[-1]) if lines else {"error": process.returncode})
    return records


def topology() -> str:
    siblings = set()
    for cpu in Path("/sys/devices/system/cpu").glob("cpu[0-9]*/topology/thread_siblings_list"):
        siblings.add(cpu.read_text().strip())
    threads = max((len(s.replace("-", ",").split(",")) for s in siblings), default=0)
    return f"{os.cpu_count()} cpus, {len(siblings)} distinct sibling sets, up to {threads} per set"


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cell", default="gqa_b1")
    parser.add_argument("--copies", type=int, nargs="*", default=[1, 2, 16])
    parser.add_argument("--cap", type=float, default=120.0)
    args = parser.parse_args(argv)
    print(topology(), flush=True)
    rows, alone = [], None
    for copies in args.copies:
        records = [r for r in run_copies(args.cell, copies, args.cap) if "error" not in r]
        seconds = sorted(r["seconds"] for r in records)
        busy = sorted(r["worker_s"] for r in records)
        verify = sorted(r["verify_s"] for r in records)
        if alone is None:
            alone = statistics.median(busy)
        rows.append((copies, len(records), seconds, busy, verify, statistics.median(busy) / alone))
        print(json.dumps({"copies": copies, "seconds": seconds, "busy": busy, "verify": verify}),
              flush=True)  # fmt: skip
    print(f"\n{args.cell}: one-worker searches run side by side (s: min / median / max)")
    print(f"{'copies':>6} {'ok':>3} {'seconds':>20} {'busy':>20} {'verify':>20} {'busy/alone':>10}")
    for copies, ok, seconds, busy, verify, ratio in rows:
        cells = [f"{min(x):.1f}/{statistics.median(x):.1f}/{max(x):.1f}"
                 for x in (seconds, busy, verify)]  # fmt: skip
        print(f"{copies:>6} {ok:>3} {cells[0]:>20} {cells[1]:>20} {cells[2]:>20} {ratio:>9.2f}x")


if __name__ == "__main__":
    main()
