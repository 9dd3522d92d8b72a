"""Run the benchmark suite (``benchmarks/SUITE.md``): every row's baselines and mugraph's
μGraph, side by side, in one process.

    python -m benchmarks.run [NAMES...|--all] [--group A|B] [--reps N] [--budget S]
        [--autotune-timeout S] [--no-autotune] [--no-compile] [--no-reference]
        [--cache DIR] [--exclude ROW:LABEL] [--out DIR] [--list]

NAMES are rows (``gqa_b1``) or workloads (``gqa``: both of its rows); none (or ``--all``):
every row. On a GPU, per row: PyTorch eager, torch.compile (default mode, and
``max-autotune-no-cudagraphs``), SDPA on its best backend (attention rows), and mugraph: the
headline is what ``row.program().superoptimize(cache=DIR)`` returns (the search's answer
that ``benchmarks.search_suite`` stored in the result cache, ``--cache``, default
``benchmarks/searched/cache``, chosen there by the GPU ranking with its launch settings),
compiled with ``mugraph.compile`` exactly as a user runs it — nothing screened or tuned by
the runner; a row the cache has no answer for has no mugraph figure and says so. Beside it,
for reference only, the hand-written μGraph of ``mugraph.library`` (its tilings screened:
the fastest that agrees). Every time is the median of ``--reps`` runs after warm-up with the
L2 cache flushed (``mugraph.optimize``'s ``profile_callable``). Before timing, every output
is compared with PyTorch's float32 result on fresh random inputs; a μGraph whose relative
error is 1e-2 or more is reported and not timed. Copy bandwidth and matmul rate are measured
once, for the floor. The work runs in passes: every row's eager, SDPA, mugraph and reference
μGraph, then torch.compile (default), then max-autotune (each workload's first row first)
until ``--budget`` seconds have passed, then the final mugraph timings; results are written
after every pass, so a whole run fits one 10-minute call. A μGraph whose kernel faults the
GPU (an illegal address: the process's CUDA context is lost) starts the run again in a fresh
process, with the same inputs, the rest of the budget and that μGraph excluded (``--exclude
ROW:LABEL``; the row notes it). Without a GPU: each μGraph (``--source``) is checked on the
Triton interpreter at the row's small sizes (TRITON_INTERPRET=1, CPU tensors; searched
μGraphs by the float64 reference semantics at suite sizes) and the cost model's estimates
stand in for times.

Writes ``<out>/results.json``, ``<out>/results.png`` and (GPU) ``<out>/results.md`` (out: this
directory by default).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import NoReturn

import torch

from benchmarks.suite import rows_table, select
from benchmarks.suite.mugraphs import (
    CACHE_DIR,
    Choice,
    choose,
    hand_written_choice,
    superoptimized,
)
from benchmarks.suite.report import (
    CPU_HEAD,
    GPU_HEAD,
    cpu_cells,
    gpu_cells,
    markdown_table,
    plot,
    suite_summary,
    summarize,
    text_table,
)
from benchmarks.suite.rows import Row
from benchmarks.suite.tensors import floor_seconds, make_inputs, rel_error
from benchmarks.suite.tuning import CudaFault

HERE = Path(__file__).resolve().parent
TOLERANCE = 1e-2  # relative error a float16 result must stay under
HAND_LABEL = "hand-written"  # how --exclude names a searched row's hand-written comparison
MAX_RESTARTS = 3  # fresh processes after CUDA faults, per run
NOMINAL_BANDWIDTH, NOMINAL_MATMUL = 3.0e12, 6.5e14  # H100 figures (CPU mode's floor)
AUTOTUNE_MODE = "max-autotune-no-cudagraphs"
STARTED = time.monotonic()


def elapsed() -> float:
    return time.monotonic() - STARTED


def log(line: str) -> None:
    print(f"[{elapsed():6.1f} s] {line}", file=sys.stderr, flush=True)


def error_text(error: BaseException) -> str:
    return f"{type(error).__name__}: {str(error).splitlines()[0][:160] if str(error) else ''}"


def base_record(row: Row) -> dict:
    moved, flops = row.counts()
    return {"row": row.name, "workload": row.workload, "group": row.group, "b": row.b,
            "shapes": row.shapes, "layout": row.layout, "bytes": moved, "flops": flops,
            "notes": []}


def add_note(rec: dict, note: str) -> None:
    rec["notes"].append(note)


def finish_status(rec: dict) -> None:
    """The row's status column: ok, or what went wrong, then the notes."""
    problems = [n for n in rec["notes"] if n]
    rec["status"] = "; ".join(problems) if problems else "ok"


def write_results(records: list[dict], meta: dict, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps({"meta": meta, "rows": records}, indent=1))


# ---- GPU --------------------------------------------------------------------------------------


@dataclass
class Live:
    """What a row keeps between passes on the GPU."""

    row: Row
    rec: dict
    choice: Choice  # the headline: what superoptimize returned
    hand: Choice | None = None  # the hand-written reference (None: not run)
    inputs: list = field(default_factory=list)
    ref: torch.Tensor | None = None
    program: object | None = None  # the compiled headline μGraph


def _copy_seconds(reps: int) -> float:
    """One 1 GiB device-to-device copy."""
    from mugraph.optimize import profile_callable

    src = torch.empty(2**29, dtype=torch.float16, device="cuda")
    dst = torch.empty_like(src)
    return profile_callable(lambda: dst.copy_(src), reps=reps).seconds


def _matmul_seconds(reps: int, size: int = 8192) -> float:
    """One fp16 size^3 matmul."""
    from mugraph.optimize import profile_callable

    a = torch.randn(size, size, dtype=torch.float16, device="cuda")
    b = torch.randn(size, size, dtype=torch.float16, device="cuda")
    return profile_callable(lambda: a @ b, reps=reps).seconds


def _tiny_kernel_seconds(reps: int) -> float:
    from mugraph.optimize import profile_callable

    tiny = torch.zeros(1, device="cuda")
    return profile_callable(lambda: tiny.add_(1), reps=reps).seconds


def measure_rates(reps: int) -> dict:
    """Copy bandwidth (bytes read + written by a 1 GiB copy), fp16 matmul rate (8192^3) and
    the time of one tiny kernel, each timed as the rows are."""
    copy = _copy_seconds(max(10, reps // 5))
    mm = _matmul_seconds(max(10, reps // 5))
    tiny = _tiny_kernel_seconds(reps)
    torch.cuda.empty_cache()
    return {"bandwidth": 2 * 2**30 / copy, "matmul_rate": 2 * 8192**3 / mm,
            "tiny_kernel_us": tiny * 1e6}


def timed(fn, reps: int) -> float | None:
    from mugraph.optimize import profile_callable

    m = profile_callable(fn, reps=reps)
    return m.microseconds if m.ok else None


def check_and_time(rec: dict, key: str, fn, ref, reps: int) -> bool:
    """Run ``fn``, compare with ``ref``, time it when it agrees; records ``<key>_err`` and
    ``<key>_us`` (or a note). True when timed."""
    name = key.removesuffix("_us")
    try:
        err = rel_error(fn(), ref)
    except Exception as error:  # noqa: BLE001
        add_note(rec, f"{name}: {error_text(error)}")
        return False
    rec[f"{name}_err"] = err
    if not err < TOLERANCE:
        add_note(rec, f"{name}: MISMATCH rel err {err:.3g}")
        return False
    rec[key] = timed(fn, reps)
    if rec[key] is None:
        add_note(rec, f"{name}: timing failed")
    return rec[key] is not None


def precompile_all(lives: list[Live]) -> None:
    """Generate every row's μGraph candidates and compile their kernels in parallel worker
    processes (Triton's disk cache), so rows then load them instead of compiling one by one."""
    from mugraph.optimize import precompile
    from mugraph.runtime.compiled import compile_graph

    programs = []
    for lv in lives:
        graphs = [graph for _, graph in lv.choice.candidates]
        if lv.hand is not None:
            graphs += [graph for _, graph in lv.hand.candidates]
        for graph in graphs:
            try:
                programs.append(compile_graph(graph, check=False))
            except Exception as error:  # noqa: BLE001 - reported when the row compiles it
                log(f"{lv.row.name}: candidate does not compile: {error_text(error)}")
    started = time.monotonic()
    errors = [e for e in precompile(programs) if e]
    log(f"precompiled {len(programs)} μGraph candidates in {time.monotonic() - started:.0f} s"
        + (f" ({len(errors)} failed: {errors[0][:100]})" if errors else ""))


def new_live(row: Row, args, rates: dict, seed: int) -> Live:
    """The row's record and μGraph choice (nothing runs yet)."""
    rec = base_record(row)
    floor, bound = floor_seconds(rec["bytes"], rec["flops"], rates["bandwidth"],
                                 rates["matmul_rate"])
    rec.update(floor_us=floor * 1e6, floor_bound=bound, seed=seed)
    try:
        graph, source, note = superoptimized(row, args.cache, args.search_time_limit)
        label = "superoptimize"
        choice = Choice(source, graph, note, label, ((label, graph),) if graph is not None else ())
    except Exception as error:  # noqa: BLE001
        choice = Choice("none", None, f"ERROR {error_text(error)}")
    rec.update(source=choice.source, source_note=choice.note, variant=choice.label)
    if choice.source == "none":
        add_note(rec, f"no mugraph figure: {choice.note}")
    hand = None
    if args.reference:
        try:
            hand = hand_written_choice(row)
        except Exception as error:  # noqa: BLE001
            rec["hand_note"] = error_text(error)
        if hand is not None and hand.graph is None:
            rec["hand_note"], hand = hand.note, None
    return Live(row, rec, choice, hand)


def pass_prepare(live: Live, args) -> None:
    """Inputs, the float32 reference, eager, SDPA, then the μGraph: every candidate checked
    and screened with default launches, the fastest that agrees kept and timed."""
    row, rec = live.row, live.rec
    program = row.program()
    live.inputs = make_inputs(program, "cuda", rec["seed"])
    with torch.no_grad():
        live.ref = row.torch_fn(*[x.float() for x in live.inputs])
    check_and_time(rec, "eager_us", lambda: row.torch_fn(*live.inputs), live.ref, args.reps)
    if row.attention:
        time_sdpa(live, args.reps)
    excluded = excluded_labels(args, row.name)
    if live.choice.graph is not None:
        screen_mugraph(live, args.reps, excluded)
    if live.hand is not None:
        time_hand_written(live, args.reps, excluded)


def mugraph_error(live: Live, program) -> float:
    """Relative error of a compiled μGraph's output against the row's reference."""
    return rel_error(program(inputs=live.inputs)[0], live.ref)


def excluded_labels(args, row_name: str) -> frozenset[str]:
    """The candidates of ``row_name`` that faulted the GPU in an earlier attempt of this run
    (``--exclude ROW:LABEL``)."""
    pairs = [item.split(":", 1) for item in args.exclude]
    return frozenset(label for row, label in pairs if row == row_name)


def screen_mugraph(live: Live, reps: int, excluded: frozenset[str] = frozenset()) -> None:
    """The headline μGraph compared with the reference and timed (through the screening
    helper, which reports mismatches, compile errors and GPU faults the same way for any
    number of candidates: here there is one, what superoptimize returned)."""
    from benchmarks.suite.tuning import screen

    rec = live.rec
    screened = screen(live.choice.candidates, live.inputs, lambda p: mugraph_error(live, p),
                      TOLERANCE, reps=max(10, reps // 5), exclude=excluded)
    rec["screen_us"] = {s.label: s.us if s.us is not None else s.note for s in screened}
    ok = [s for s in screened if s.us is not None]
    if not ok:
        first = screened[0].note if screened else "no candidate"
        add_note(rec, f"mugraph: {first}" + (f" (all {len(screened)} candidates failed)"
                                              if len(screened) > 1 else ""))
        return
    best = min(ok, key=lambda s: s.us)
    failed = [s for s in screened if s.us is None]
    if failed:
        add_note(rec, f"{len(failed)} of {len(screened)} candidates dropped "
                      f"({failed[0].label}: {failed[0].note})")
    live.program = best.program
    rec["variant"] = best.label
    rec["mugraph_err"] = mugraph_error(live, best.program)
    rec["mugraph_us"] = timed(lambda: best.program(inputs=live.inputs), reps)
    rec["mugraph_default_us"] = rec["mugraph_us"]


def time_hand_written(live: Live, reps: int, excluded: frozenset[str] = frozenset()) -> None:
    """The reference column (never the row's mugraph figure): the hand-written μGraph of
    ``mugraph.library``, its tilings screened with default launches, the fastest that agrees
    timed."""
    from benchmarks.suite.tuning import screen

    rec = live.rec
    candidates = [(f"{HAND_LABEL}:{label}", graph) for label, graph in live.hand.candidates]
    screened = screen(candidates, live.inputs, lambda p: mugraph_error(live, p), TOLERANCE,
                      reps=max(10, reps // 5), exclude=excluded)
    ok = [x for x in screened if x.us is not None]
    if not ok:
        rec["hand_note"] = screened[0].note if screened else "no candidate"
        return
    best = min(ok, key=lambda x: x.us)
    rec["hand_err"] = mugraph_error(live, best.program)
    rec["hand_us"] = timed(lambda: best.program(inputs=live.inputs), reps)
    rec["hand_variant"] = best.label.removeprefix(f"{HAND_LABEL}:")


def time_sdpa(live: Live, reps: int) -> None:
    """The best (form, backend) of SDPA that runs and agrees with the reference."""
    from benchmarks.suite.baselines import sdpa_candidates

    rec, best = live.rec, None
    tried = {}
    for label, fn in sdpa_candidates(live.row, live.inputs):
        try:
            err = rel_error(fn(), live.ref)
        except Exception as error:  # noqa: BLE001 - a backend that does not apply
            tried[label] = error_text(error)[:60]
            continue
        if not err < TOLERANCE:
            tried[label] = f"mismatch {err:.2g}"
            continue
        us = timed(fn, reps)
        tried[label] = us
        if us is not None and (best is None or us < best[1]):
            best = (label, us, err)
    rec["sdpa_tried"] = tried
    if best is None:
        add_note(rec, "SDPA: no backend ran")
        return
    rec["sdpa_backend"], rec["sdpa_us"], rec["sdpa_err"] = best


def pass_compile(live: Live, mode: str | None, key: str, timeout: float, reps: int) -> None:
    """torch.compile of the row's function with ``mode``: compile (capped), check, time."""
    from benchmarks.suite.baselines import compile_baseline

    rec = live.rec
    name = key.removesuffix("_us")
    fn, out, spent, note = compile_baseline(live.row.family.torch_fn, live.inputs, mode,
                                            timeout)
    rec[f"{name}_compile_s"] = round(spent, 1)
    if fn is None:
        add_note(rec, f"torch.compile({mode or 'default'}): {note}")
        return
    check_and_time(rec, key, fn, live.ref, reps)
    torch._dynamo.reset()


def pass_final(live: Live, reps: int) -> None:
    """Time the headline μGraph again (compile workers gone)."""
    if live.program is None:
        return
    live.rec["mugraph_us"] = timed(lambda: live.program(inputs=live.inputs), reps)


def autotune_order(lives: list[Live]) -> list[Live]:
    """Each workload's first row before any workload's second, so a budget that runs out
    leaves every workload with one max-autotune figure."""
    first, second, seen = [], [], set()
    for lv in lives:
        (second if lv.row.workload in seen else first).append(lv)
        seen.add(lv.row.workload)
    return first + second


def run_gpu(rows: list[Row], args, out: Path) -> list[dict]:
    from mugraph.optimize.precompile import shutdown

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    rates = measure_rates(args.reps)
    meta = gpu_meta(args, rates)
    log(f"{meta['device']}: copy {rates['bandwidth'] / 1e12:.2f} TB/s, matmul "
        f"{rates['matmul_rate'] / 1e12:.0f} TFLOP/s, tiny kernel {rates['tiny_kernel_us']:.1f} us")
    seed = args.seed if args.seed is not None else int.from_bytes(os.urandom(4), "little")
    lives = [new_live(row, args, rates, seed + i) for i, row in enumerate(rows)]
    save = _saver(lives, meta, out)
    if args.precompile:
        precompile_all(lives)
    for lv in lives:
        try:
            pass_prepare(lv, args)
        except CudaFault as fault:
            restart_after_fault(args, f"{lv.row.name}:{fault.label}", seed, fault)
        except Exception as error:  # noqa: BLE001 - the row reports it, the others go on
            add_note(lv.rec, f"ERROR {error_text(error)}")
            traceback.print_exc(limit=3, file=sys.stderr)
            lv.program, lv.inputs = None, []
        log(f"prepared {lv.row.name}: eager {lv.rec.get('eager_us')} us, mugraph "
            f"{lv.rec.get('mugraph_us')} us ({lv.rec.get('variant')})")
    save("prepare")
    runnable = [lv for lv in lives if lv.inputs]
    if args.compile:
        for lv in runnable:
            if elapsed() > args.budget - args.autotune_reserve:
                add_note(lv.rec, "torch.compile: skipped (time budget)")
                continue
            pass_compile(lv, None, "compile_us", args.compile_timeout, args.reps)
            log(f"torch.compile {lv.row.name}: {lv.rec.get('compile_us')} us "
                f"({lv.rec.get('compile_compile_s')} s)")
        save("compile")
    if args.autotune:
        for lv in autotune_order(runnable):
            left = args.budget - elapsed()
            if left < 5:
                add_note(lv.rec, "max-autotune: skipped (time budget)")
                continue
            pass_compile(lv, AUTOTUNE_MODE, "autotune_us", min(args.autotune_timeout, left),
                         args.reps)
            log(f"max-autotune {lv.row.name}: {lv.rec.get('autotune_us')} us "
                f"({lv.rec.get('autotune_compile_s')} s)")
        save("max-autotune")
    shutdown()
    for lv in runnable:
        pass_final(lv, args.reps)
    records = [summarize(lv.rec) for lv in lives]
    for rec in records:
        finish_status(rec)
    save("done")
    meta["chart"] = plot(records, out / "results.png")
    write_results(records, meta, out)
    caption = (f"{meta['device']}, torch {meta['torch']}, triton {meta['triton']}; times in µs, "
               f"median of {args.reps} runs, L2 flushed; speedup = best baseline / mugraph; "
               f"floor = max(bytes / {rates['bandwidth'] / 1e12:.2f} TB/s, flops / "
               f"{rates['matmul_rate'] / 1e12:.0f} TFLOP/s)")
    cells = [gpu_cells(r) for r in records]
    summary = suite_summary(records)
    meta["summary"] = summary
    write_results(records, meta, out)
    (out / "results.md").write_text(
        f"{caption}\n\n{markdown_table(GPU_HEAD, cells)}\n\n{summary}\n")
    print(f"\n{caption}")
    print(text_table(GPU_HEAD, cells))
    print(summary)
    print(f"\n{meta['chart']}; {out / 'results.json'}; {elapsed():.0f} s in all")
    return records


def restart_after_fault(args, where: str, seed: int, fault: Exception) -> NoReturn:
    """A candidate faulted the GPU (``where`` = ROW:LABEL): this process's CUDA context is
    gone, so the run starts again in a fresh process, with the same inputs, the rest of the
    budget, and that candidate excluded (at most ``MAX_RESTARTS`` times)."""
    from mugraph.optimize.precompile import shutdown

    if args.restarts >= MAX_RESTARTS:
        raise SystemExit(f"CUDA fault in {where} after {args.restarts} restarts: {fault}")
    log(f"CUDA fault in {where}: {str(fault)[:200]}; starting again without it")
    shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    argv = [*args.argv, "--exclude", where, "--restarts", str(args.restarts + 1),
            "--seed", str(seed), "--budget", f"{max(60.0, args.budget - elapsed()):.0f}"]
    os.execv(sys.executable, [sys.executable, "-m", "benchmarks.run", *argv])


def _saver(lives: list[Live], meta: dict, out: Path):
    def save(stage: str) -> None:
        meta["stage"], meta["elapsed_s"] = stage, round(elapsed(), 1)
        write_results([summarize(dict(lv.rec)) for lv in lives], meta, out)

    return save


def gpu_meta(args, rates: dict) -> dict:
    import triton

    props = torch.cuda.get_device_properties(0)
    return {
        "mode": "gpu", "date": time.strftime("%Y-%m-%d %H:%M"), "device": props.name,
        "torch": torch.__version__, "triton": triton.__version__,
        "cuda": torch.version.cuda, "driver": _driver_version(), "reps": args.reps,
        "excluded_after_faults": list(args.exclude), "restarts": args.restarts,
        "method": "median of CUDA-event times, L2 flushed before each run (profile_callable)",
        "floor": "max(bytes / measured copy bandwidth, flops / measured fp16 matmul rate)",
        **rates,
    }


def _driver_version() -> str:
    try:
        import subprocess

        done = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                              capture_output=True, text=True, timeout=10, check=False)
        return done.stdout.strip().splitlines()[0] if done.stdout.strip() else "?"
    except Exception:  # noqa: BLE001
        return "?"


# ---- CPU ----------------------------------------------------------------------------------------


def cpu_row(row: Row, args, seed: int) -> dict:
    """The μGraph's check (interpreter at small sizes, or float64 semantics for a searched
    graph) and the cost model's estimates at suite sizes."""
    from mugraph.optimize import estimate
    from mugraph.runtime.compiled import compile_graph
    from mugraph.search.driver import reference_recheck

    rec = base_record(row)
    floor, bound = floor_seconds(rec["bytes"], rec["flops"], NOMINAL_BANDWIDTH, NOMINAL_MATMUL)
    rec.update(floor_us=floor * 1e6, floor_bound=bound, seed=seed)
    program = row.program()
    choice = choose(row, args.source)
    rec.update(source=choice.source, source_note=choice.note, variant=choice.label)
    rec["naive_est_us"] = estimate(program).seconds * 1e6
    if choice.graph is None:
        add_note(rec, f"no μGraph: {choice.note}")
        return rec
    rec["mugraph_est_us"] = estimate(choice.graph).seconds * 1e6
    if choice.source == "searched":
        err = reference_recheck(choice.graph, program, seed=seed % 2**32)
        rec.update(check="float64 semantics, suite sizes", rel_err=err)
        if not err < 1e-9:
            add_note(rec, f"MISMATCH: float64 re-check {err:.3g}")
        return rec
    small = hand_written_choice(row, small=True)
    if small.graph is None:
        add_note(rec, f"small-size μGraph: {small.note}")
        return rec
    inputs = make_inputs(row.program(small=True), "cpu", seed)
    ref = row.torch_fn(*[x.float() for x in inputs])
    try:
        err = rel_error(compile_graph(small.graph, check=False)(inputs=inputs)[0], ref)
    except Exception as error:  # noqa: BLE001
        add_note(rec, f"interpreter run failed: {error_text(error)}")
        return rec
    rec.update(check=f"interpreter, small sizes ({small.label})", rel_err=err)
    if not err < TOLERANCE:
        add_note(rec, f"MISMATCH rel err {err:.3g}" + _overflow_hint(row, err))
    return rec


def _overflow_hint(row: Row, err: float) -> str:
    if math.isinf(err) and row.attention:
        return " (non-finite: exp of unscaled logits overflows float16)"
    return ""


def run_cpu(rows: list[Row], args, out: Path) -> list[dict]:
    from mugraph.codegen.loader import interpreter_active

    if not interpreter_active():
        raise SystemExit("no CUDA device: set TRITON_INTERPRET=1 to check on the interpreter")
    import triton

    meta = {"mode": "cpu (Triton interpreter; cost-model estimates, not times)",
            "date": time.strftime("%Y-%m-%d %H:%M"), "torch": torch.__version__,
            "triton": triton.__version__,
            "floor": "max(bytes / 3.0 TB/s, flops / 650 TFLOP/s), nominal H100 figures"}
    seed = args.seed if args.seed is not None else int.from_bytes(os.urandom(4), "little")
    records = []
    for i, row in enumerate(rows):
        try:
            rec = cpu_row(row, args, seed + i)
        except Exception as error:  # noqa: BLE001
            rec = base_record(row)
            add_note(rec, f"ERROR {error_text(error)}")
            traceback.print_exc(limit=3, file=sys.stderr)
        finish_status(rec)
        records.append(rec)
        log(f"{row.name}: {rec['status']}")
        write_results(records, meta, out)
    print("no CUDA device: μGraphs checked on the Triton interpreter at small sizes; times are"
          " the cost model's estimates at suite sizes (µs, H100), not measurements")
    print(text_table(CPU_HEAD, [cpu_cells(r) for r in records]))
    print(f"\n{out / 'results.json'}")
    return records


# ---- command line ------------------------------------------------------------------------------


def parse_args(argv=None, cuda: bool | None = None):
    cuda = torch.cuda.is_available() if cuda is None else cuda
    parser = argparse.ArgumentParser(prog="python -m benchmarks.run",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="*", help="rows or workloads (default: all)")
    parser.add_argument("--all", action="store_true", help="every row (the default)")
    parser.add_argument("--group", choices=["A", "B", "a", "b"], default=None)
    parser.add_argument("--reps", type=int, default=100, help="timed runs per measurement")
    parser.add_argument("--budget", type=float, default=500.0,
                        help="seconds after which no new compile or tuning starts")
    parser.add_argument("--compile-timeout", type=float, default=60.0,
                        help="cap on one torch.compile (default mode), seconds")
    parser.add_argument("--autotune-timeout", type=float, default=40.0,
                        help="cap on one max-autotune-no-cudagraphs compile, seconds")
    parser.add_argument("--no-compile", dest="compile", action="store_false",
                        help="skip torch.compile (both modes)")
    parser.add_argument("--no-autotune", dest="autotune", action="store_false",
                        help="skip torch.compile max-autotune-no-cudagraphs")
    parser.add_argument("--no-reference", dest="reference", action="store_false",
                        help="skip the hand-written reference μGraphs")
    parser.add_argument("--autotune-reserve", type=float, default=60.0,
                        help="seconds of the budget torch.compile leaves for max-autotune")
    parser.add_argument("--cache", type=Path, default=CACHE_DIR,
                        help="the result cache superoptimize answers from")
    parser.add_argument("--search-time-limit", type=float, default=None,
                        help="the budget the rows were searched with (default: each row's "
                             "benchmarks/searched/<row>.json); a cached search cut short by a "
                             "smaller budget does not answer a larger one")
    parser.add_argument("--no-precompile", dest="precompile", action="store_false",
                        help="compile the μGraphs' kernels one by one, in this process")
    parser.add_argument("--source", choices=["auto", "searched", "hand"], default="auto",
                        help="CPU check mode and --list only: which μGraph to check")
    parser.add_argument("--seed", type=int, default=None, help="input seed (default: fresh)")
    parser.add_argument("--out", type=Path, default=HERE, help="directory of results.json/png")
    parser.add_argument("--list", action="store_true", help="print the rows and exit")
    parser.add_argument("--exclude", action="append", default=[], metavar="ROW:LABEL",
                        help="a candidate not to run (one that faulted the GPU)")
    parser.add_argument("--restarts", type=int, default=0, help=argparse.SUPPRESS)
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parser.parse_args(argv)
    args.argv = argv
    if not args.compile:
        args.autotune = False
    args.cuda = cuda
    return args


def main(argv=None) -> list[dict]:
    args = parse_args(argv)
    if args.list:
        print(rows_table(args.source))
        return []
    rows = select([] if args.all else args.names, args.group)
    if not rows:
        raise SystemExit("no rows selected")
    if args.cuda:
        return run_gpu(rows, args, args.out)
    os.environ.setdefault("TRITON_INTERPRET", "1")
    return run_cpu(rows, args, args.out)


if __name__ == "__main__":
    main()
