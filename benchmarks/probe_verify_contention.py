"""How much a candidate's verification slows down when many processes verify at once, by the
size of the verifier's product tiles (issue 16: the search's workers verify side by side).

    python benchmarks/probe_verify_contention.py [--row gqa_b1] [--procs 1 16] [--reps 3]

The program's first verification round is drawn and evaluated once, then ``P`` processes are
forked (sharing it, as the search's zygote workers do); each verifies the row's searched
μGraph and its alternatives (``benchmarks/searched/ROW.json``) ``--reps`` times with one
verifier thread and the given tile sizes (``field_arith._TILE_OUT`` GEMM outputs, twice as
many converted elements). Printed: mean milliseconds per verification per process count and
tile size, and the slowdown against one process.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def _graphs(row: str, count: int) -> list:
    import mugraph

    data = json.loads((ROOT / "benchmarks" / "searched" / f"{row}.json").read_text())
    texts = [json.dumps(data["graph"])] + [json.dumps(a["graph"]) for a in
                                           data.get("alternatives", [])]
    unique = list(dict.fromkeys(texts))[:count]
    return [mugraph.from_json(t) for t in unique]


def _child(rounds, graphs, reps: int, tile: int, start: float, out) -> None:
    from mugraph.semantics import field_arith

    field_arith._MAX_WORKERS = 1
    field_arith._TILE_OUT, field_arith._TILE_CONVERT = tile, 2 * tile
    while time.time() < start:
        time.sleep(0.001)
    t0 = time.perf_counter()
    for _ in range(reps):
        for g in graphs:
            rounds.verify(g, max_rounds=1)
    ms = (time.perf_counter() - t0) / (reps * len(graphs)) * 1e3
    os.write(out, f"{ms}\n".encode())
    os._exit(0)


def measure(rounds, graphs, procs: int, reps: int, tile: int) -> float:
    r, w = os.pipe()
    start = time.time() + 0.3
    pids = []
    for _ in range(procs):
        pid = os.fork()
        if pid == 0:
            os.close(r)
            _child(rounds, graphs, reps, tile, start, w)
        pids.append(pid)
    os.close(w)
    for pid in pids:
        os.waitpid(pid, 0)
    with os.fdopen(r) as f:
        values = [float(line) for line in f.read().split()]
    return sum(values) / len(values)


def main(argv=None) -> None:
    os.environ["MUGRAPH_VERIFY_THREADS"] = "1"
    parser = argparse.ArgumentParser()
    parser.add_argument("--row", default="gqa_b1")
    parser.add_argument("--procs", type=int, nargs="+", default=[1, 16])
    parser.add_argument("--tiles", type=int, nargs="+", default=[1 << 18, 1 << 16, 1 << 14])
    parser.add_argument("--graphs", type=int, default=6)
    parser.add_argument("--reps", type=int, default=3)
    args = parser.parse_args(argv)

    from benchmarks.suite.rows import select
    from mugraph.search.verify import ProgramRounds
    from mugraph.semantics import field_arith

    (row,) = select([args.row])
    program = row.program()
    graphs = _graphs(args.row, args.graphs)
    rounds = ProgramRounds(program)
    field_arith._MAX_WORKERS = 1
    rounds.prepare(1)
    field_arith.stop_threads()
    for g in graphs:  # checks they verify (and warms nothing shared: children fork after)
        assert rounds.verify(g, max_rounds=1).passed
    print(f"{args.row}: {len(graphs)} μGraphs, cpus {os.cpu_count()}")
    print(f"{'tile':>8} " + " ".join(f"{f'P={p} ms':>10}" for p in args.procs) + "  slowdown")
    for tile in args.tiles:
        ms = [measure(rounds, graphs, p, args.reps, tile) for p in args.procs]
        print(f"{tile:>8} " + " ".join(f"{m:>10.1f}" for m in ms) + f"  {ms[-1] / ms[0]:.2f}x",
              flush=True)


if __name__ == "__main__":
    main()
