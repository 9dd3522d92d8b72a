"""Search time on 1, 2, 4, 8 and 16 workers, the local process pool and Ray side by side
(issue 16), for the Table 5 cell with 6 block operators and one suite search.

    python benchmarks/bench_scaling.py [--budget 500] [--workers 1 2 4 8 16]
        [--cells table5_6 gqa_b1 gated_mlp_b1] [--engines local ray]

Cells (each a complete search; its time is the whole ``superoptimize`` call, worker start-up
included):
- ``table5_6``: GQA at small shapes, every unit up to 6 block operators, no deepening (the
  6-operator cell of ``benchmarks/bench_table5.py``);
- ``gqa_b1``: the suite row at suite sizes under its shape-class preset (``attention``: one
  kernel or split-KV with a combining kernel), the search ``superoptimize`` runs for it (on 16
  workers it did not finish 1314 units in 12 s on the H100 machine, 2026-11-23);
- ``gated_mlp_b1``: the suite row at suite sizes (X 8x4096, W1, W3 4096x4096), one-kernel
  μGraphs of up to 6 block operators, preset ``mlp`` (since the verifier got faster this search
  completes in about 2 s on 2 workers: too short to measure scaling, not run by default);
- ``row:NAME``: any suite row (``benchmarks/suite/rows.py``) at suite sizes, searched as
  ``superoptimize`` does by default (``row:gated_mlp_b1``: 486 units, about 45 s on one worker
  here; ``row:gqa_b8``: about 50 s on two).

Every process verifies with one thread (``MUGRAPH_VERIFY_THREADS=1``), so a worker is a core.
Each configuration runs in its own process. The engines run one after the other, the local
pool first: Ray's configurations join one local Ray cluster (``ray start --head``, started
after the local runs and timed apart), so that no local run shares the machine with Ray's
idle processes. To fit one bounded run, an engine's configurations run in waves, the ones of
a wave at the same time on disjoint numbers of cores: the 1-worker runs of the cells
together, then every 16-worker run alone, then the 8-worker runs, then each cell's 2- and
4-worker runs together; when the budget runs short, the last waves get the shortest caps.
Runs that share the machine can only be slowed by it, so speedups at 2 and 4 workers are,
if anything, understated (and the 1-worker runs of two cells share it too). A run cut by its
cap prints ``>cap`` (and its speedup ``>``: a lower bound). Every time includes starting the
workers (a fresh process pool, fresh Ray workers of a
new job). The table is printed last; ``--json FILE`` keeps the raw records.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CELLS = ("table5_6", "gqa_b1", "gated_mlp_b1")
DEFAULT_CELLS = ("table5_6", "gqa_b1")


def cell_program(cell: str):
    """(program, superoptimize options) of a cell."""
    if cell == "table5_6":
        from mugraph.library import WORKLOADS

        workload = WORKLOADS["attention_mirage_gqa"]
        return workload.naive(workload.small), {"max_block_ops": 6, "deepening": False}
    if cell == "gqa_b1":
        from benchmarks.suite.rows import select

        (row,) = select(["gqa_b1"])
        return row.program(), {}
    if cell.startswith("row:"):  # any suite row, searched as superoptimize does by default
        from benchmarks.suite.rows import select

        (row,) = select([cell[4:]])
        return row.program(), {}
    if cell == "gated_mlp_b1":
        from benchmarks.suite.rows import select

        (row,) = select(["gated_mlp_b1"])
        options = {"preset": row.family.preset, "max_custom_kernels": 1, "max_block_ops": 6}
        return row.program(), options
    raise SystemExit(f"unknown cell {cell!r}; cells: {', '.join(CELLS)}, row:NAME")


def run_one(cell: str, engine: str, workers: int, cap: float) -> dict:
    """One configuration, in this process; returns its record."""
    from mugraph.search import driver

    program, options = cell_program(cell)
    extra = {"engine": "ray", "address": "auto"} if engine == "ray" else {}
    if engine.startswith("local:"):  # the local pool with another start method ("local:exec")
        extra = {"start_method": engine.split(":", 1)[1]}
    made = []
    original = driver._OracleAdapter.__init__

    def keep(self, targets):  # to read the oracle's query counts afterwards
        original(self, targets)
        made.append(self)

    driver._OracleAdapter.__init__ = keep
    try:
        started = time.monotonic()
        result = driver.superoptimize(program, time_limit=cap, workers=workers, **options, **extra)
        seconds = time.monotonic() - started
    finally:
        driver._OracleAdapter.__init__ = original
    best = result.candidates[0] if result.candidates else None
    record = {
        "cell": cell,
        "engine": engine,
        "workers": workers,
        "seconds": round(seconds, 2),
        "complete": not result.timed_out and result.units_done == result.units_total,
        "units": f"{result.units_done}/{result.units_total}",
        "states": result.stats.states,
        "verified": len(result.candidates),
        "best_hash": best.hash if best else None,
        "best_us": round(best.cost * 1e6, 3) if best else None,
        "lost_items": len(result.failed_items),
        "phases": {k: round(v, 2) for k, v in result.phases.items()},
        "memo_shared": result.stats.pruned.get("memo_shared", 0),
        "memo_waits": result.stats.pruned.get("memo_waits", 0),
        "memo_wait_s": round(result.stats.pruned.get("memo_wait_ms", 0) / 1e3, 2),
        "memo_io_s": round(result.stats.pruned.get("memo_io_ms", 0) / 1e3, 2),
        "kept_shared": result.stats.pruned.get("kept_shared", 0),
        "kept_io_s": round(result.stats.pruned.get("kept_io_ms", 0) / 1e3, 2),
        "handed_back": result.handed_back,
        "worker_s": round(result.worker_seconds, 2),
        "cpu_s": round(result.worker_cpu_seconds, 2),
        "tail_s": round(result.tail_seconds, 2),
        "verify_s": round(result.stats.timers.get("verify", 0) / 1e3, 2),
        "first_work": result.first_work[:1] + result.first_work[-1:],
        "started": next((line for line in result.log if "workers loaded" in line), ""),
    }
    if workers == 1 and engine == "local":  # the inline search: its oracle answered it all
        stats = made[-1].oracle.stats
        record["oracle"] = {
            **oracle_costs(program),
            "queries": stats.queries,
            "uncached": stats.uncached,
            "median_uncached_us": round(stats.median_uncached_s * 1e6, 2),
        }
    return record


def oracle_costs(program) -> dict:
    """What sharing the oracle costs against rebuilding it per worker: building the e-graph
    (egglog) against shipping its exported tables (pickle), and how many uncached queries a
    search makes (each worker repeats them: its answer cache starts empty)."""
    import pickle

    from mugraph.search.driver import _OracleAdapter, program_terms

    started = time.perf_counter()
    oracle = _OracleAdapter(program_terms(program))
    build = time.perf_counter() - started
    data = pickle.dumps(oracle)
    started = time.perf_counter()
    pickle.loads(data)
    load = time.perf_counter() - started
    return {"build_s": round(build, 4), "pickle_bytes": len(data), "unpickle_s": round(load, 5)}


# ---- the orchestra -------------------------------------------------------------------------


def _env() -> dict:
    env = dict(os.environ)
    env["MUGRAPH_VERIFY_THREADS"] = "1"
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    env["PYTHONUNBUFFERED"] = "1"
    return env


def _launch(cell, engine, workers, cap, log_dir: Path | None):
    command = [sys.executable, str(Path(__file__).resolve()), "--one", cell, engine,
               str(workers), "--cap", str(cap)]  # fmt: skip
    err = open(log_dir / f"{cell}_{engine}_{workers}.err", "w") if log_dir else subprocess.DEVNULL  # noqa: SIM115
    return subprocess.Popen(command, env=_env(), stdout=subprocess.PIPE, stderr=err, text=True)


def waves(cells, engine, counts) -> list[list[tuple[str, str, int]]]:
    """Groups of one engine's configurations run at the same time (see the module
    docstring)."""
    out = [[(c, engine, 1) for c in cells if 1 in counts]]
    out += [[(c, engine, 16)] for c in cells if 16 in counts]
    out += [[(c, engine, 8)] for c in cells if 8 in counts]
    for cell in cells:
        out.append([(cell, engine, n) for n in (2, 4) if n in counts])
    return [w for w in out if w]


def _ray(*command: str) -> None:
    subprocess.run([sys.executable, "-m", "ray.scripts.scripts", *command], env=_env(),
                   check=command[0] == "start", capture_output=True)  # fmt: skip


def orchestrate(args) -> list[dict]:
    deadline = time.monotonic() + args.budget
    log_dir = Path(args.logs) if args.logs else None
    if log_dir:
        log_dir.mkdir(parents=True, exist_ok=True)
    records: list[dict] = []
    engines = sorted(args.engines, key=lambda e: e == "ray")  # the local pool first
    plan = [w for e in engines for w in waves(args.cells, e, set(args.workers))]
    ray_started = False
    try:
        for i, wave in enumerate(plan):
            if wave[0][1] == "ray" and not ray_started:
                started = time.monotonic()
                _ray("start", "--head", f"--num-cpus={os.cpu_count()}",
                     "--include-dashboard=false", "--disable-usage-stats")  # fmt: skip
                ray_started = True
                print(f"ray start --head: {time.monotonic() - started:.1f} s", flush=True)
            later = len(plan) - i - 1
            cap = min(args.cap, deadline - time.monotonic() - 15 * later - 10)
            if cap < 5:
                print(f"budget spent: skipping {wave}", flush=True)
                continue
            running = [(cfg, _launch(*cfg, cap, log_dir)) for cfg in wave]
            for cfg, process in running:
                out, _ = process.communicate(timeout=cap + 120)
                lines = [line for line in out.splitlines() if line.startswith("{")]
                record = json.loads(lines[-1]) if lines else {
                    "cell": cfg[0], "engine": cfg[1], "workers": cfg[2], "error":
                    f"exit {process.returncode}"}  # fmt: skip
                record["wave"] = i
                record["cap"] = round(cap, 1)
                records.append(record)
                print(json.dumps(record), flush=True)
    finally:
        if ray_started:
            _ray("stop", "--force")
    return records


def table(records: list[dict]) -> str:
    lines = []
    for cell in dict.fromkeys(r["cell"] for r in records):
        rows = [r for r in records if r["cell"] == cell]
        lines.append(f"\n{cell}: seconds per complete search (speedup over 1 worker)")
        engines = list(dict.fromkeys(r["engine"] for r in rows))
        lines.append(f"{'workers':>8}" + "".join(f"{e:>22}" for e in engines) + "   same best")
        base = {e: _get(rows, e, 1) for e in engines}
        reference = _get(rows, "local", 1)
        for n in sorted({r["workers"] for r in rows}):
            cells, same = [], []
            for e in engines:
                r = _get(rows, e, n)
                if r is None or "error" in r:
                    cells.append("-" if r is None else r["error"])
                    continue
                text = f"{r['seconds']:.1f}" if r["complete"] else f">{r['cap']:.0f}"
                b = base[e]
                if b and b.get("complete") and r["complete"]:
                    text += f" ({b['seconds'] / r['seconds']:.1f}x)"
                elif b and r["complete"]:
                    text += f" (>{b['cap'] / r['seconds']:.1f}x)"
                cells.append(text)
                if reference and reference.get("best_hash") and r["complete"]:
                    same.append(r["best_hash"] == reference["best_hash"])
            mark = "yes" if same and all(same) else "NO" if same else "-"
            lines.append(f"{n:>8}" + "".join(f"{c:>22}" for c in cells) + f"   {mark}")
        for r in rows:
            if r["workers"] == max(x["workers"] for x in rows) and r.get("phases"):
                spent = ", ".join(f"{k} {v:.1f} s" for k, v in r["phases"].items())
                lines.append(f"  {r['engine']}, {r['workers']} workers: {spent}; "
                             f"states {r['states']}; waits for claimed continuations "
                             f"{r.get('memo_waits', 0)} ({r.get('memo_wait_s', 0)} s summed "
                             f"over workers); regions handed back "
                             f"{r.get('handed_back', 0)}")  # fmt: skip
                if r.get("worker_s") and r["phases"].get("search"):
                    lines.append(
                        f"    busy {r['worker_s']:.1f} s of {r['workers']} x "
                        f"{r['phases']['search']:.1f} s searching "
                        f"({r['worker_s'] / (r['workers'] * r['phases']['search']):.0%}); "
                        f"{r.get('tail_s', 0):.1f} s from the queue's running dry to the end"
                        + (f"; {r['started']}" if r.get("started") else "")
                    )
        oracle = (reference or {}).get("oracle")
        if oracle:
            rebuild = oracle["uncached"] * oracle["median_uncached_us"] * 1e-6
            lines.append(
                f"  oracle: built (egglog) in {oracle['build_s'] * 1e3:.0f} ms; shipped as "
                f"{oracle['pickle_bytes'] / 1024:.0f} KB of tables, unpickled in "
                f"{oracle['unpickle_s'] * 1e3:.1f} ms; the 1-worker search asked "
                f"{oracle['queries']} queries, {oracle['uncached']} uncached (median "
                f"{oracle['median_uncached_us']:.1f} us): a worker refilling its answer cache "
                f"costs at most {rebuild:.2f} s"
            )
    return "\n".join(lines)


def _get(rows, engine, workers):
    return next((r for r in rows if r["engine"] == engine and r["workers"] == workers), None)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--budget", type=float, default=500.0, help="seconds for everything")
    parser.add_argument("--cap", type=float, default=240.0, help="most seconds per run")
    parser.add_argument("--workers", type=int, nargs="*", default=[1, 2, 4, 8, 16])
    parser.add_argument("--cells", nargs="*", default=list(DEFAULT_CELLS))
    parser.add_argument("--engines", nargs="*", default=["local", "ray"])
    parser.add_argument("--json", default=None, help="write the records here")
    parser.add_argument("--logs", default=None, help="folder for each run's stderr")
    parser.add_argument("--one", nargs=3, metavar=("CELL", "ENGINE", "WORKERS"))
    args = parser.parse_args(argv)
    if args.one:
        cell, engine, workers = args.one
        print(json.dumps(run_one(cell, engine, int(workers), args.cap)), flush=True)
        return
    print(f"cpus: {os.cpu_count()}; {_cpu_model()}; {_numpy_bytecode()}", flush=True)
    records = orchestrate(args)
    if args.json:
        Path(args.json).write_text(json.dumps(records, indent=1))
    print(table(records))


def _numpy_bytecode() -> str:
    """Whether NumPy's modules have compiled bytecode. Every worker process imports NumPy;
    without bytecode (an image built with ``PYTHONDONTWRITEBYTECODE``, like the GPU machines'
    in the twenty-fourth session) it compiles NumPy's sources at each start: 0.33-0.42 s
    against 0.15 s there. ``python -m compileall <numpy's folder>`` writes it."""
    import importlib.util

    import numpy

    source = Path(numpy.__file__).parent / "lib" / "_function_base_impl.py"
    if not source.exists():
        return "numpy bytecode unknown"
    present = Path(importlib.util.cache_from_source(str(source))).exists()
    return f"numpy bytecode {'present' if present else 'ABSENT'}"


def _cpu_model() -> str:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return "cpu model unknown"
    models = [line.split(":", 1)[1].strip() for line in text.splitlines()
              if line.startswith("model name")]  # fmt: skip
    siblings = [line for line in text.splitlines() if line.startswith(("siblings", "cpu cores"))]
    return f"{models[0] if models else '?'}; {', '.join(sorted(set(siblings)))}"


if __name__ == "__main__":
    main()
