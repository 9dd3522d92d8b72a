"""Time each hand-written μGraph of ``mugraph.library`` beside PyTorch eager and torch.compile.

On a GPU, for every workload at its suite shapes (``benchmarks/SUITE.md``, b=1) and the
library's extra shape sets: the median time with the L2 cache flushed between runs (CUDA
events) of PyTorch eager (the naive program), ``torch.compile`` of it (default mode) and the
μGraph, compiled and tuned (``mugraph.optimize.optimize_graphs``: the library's tile sizes and
the variants of :data:`TILE_CHOICES`, each kernel's num_warps / num_stages / unrolling), the
speedup over the best baseline, and the floor: max(bytes each input read once and each output
written once / 3.0e12 B/s, matmul flops / 6.5e14 flop/s). A μGraph result counts only if its
output matches eager's (relative error under 1e-2). Rows go to ``results_handwritten.json``
and ``results_handwritten.md`` beside this script. Without a GPU it prints the cost model's
estimates instead. A row that fails prints its error and the table goes on.

    python benchmarks/bench_handwritten.py [--reps N] [--only NAME] [--no-tune]
        [--no-compile] [--choices default|wide|none] [--budget SECONDS] [--out PREFIX]
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import sys
import time
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from mugraph.codegen.torch_ops import run_torch_op  # noqa: E402
from mugraph.ir.ops import OpKind  # noqa: E402
from mugraph.library import WORKLOADS  # noqa: E402
from mugraph.optimize import estimate, profile_callable, profile_loop  # noqa: E402

BANDWIDTH = 3.0e12  # measured copy bandwidth of the H100 (bytes / s)
MATMUL_RATE = 6.5e14  # fp16 matmul (flop / s)
HERE = Path(__file__).resolve().parent


def _product(**axes):
    keys = list(axes)
    return [dict(zip(keys, values, strict=True)) for values in itertools.product(*axes.values())]


# Tile-size variants tried beside the library's own sizes (overrides of the row's sizes; a
# variant that does not divide the shapes, or that the builder rejects, is skipped).
TILE_CHOICES: dict[str, dict[str, list[dict[str, int]]]] = {
    "default": {  # around the best of a wide sweep on an H100 (results_handwritten.json)
        "rmsnorm_linear": _product(n_tile=[48, 64, 128], k_tile=[128, 256]),
        "gated_mlp": _product(n_tile=[32, 64], k_tile=[128, 256]),
        "lora": _product(n_tile=[32, 64], k_tile=[128, 256, 512]),
        "adapter_mlp": [
            {"parts": p, "k_tile": 4096 // p, "n_tile": n} for p in (16, 32, 64) for n in (64, 128)
        ],
        "attention_flashdecoding": _product(parts=[4, 8], s_parts=[8, 16], n_tile=[64, 128]),
        "attention_mirage_gqa": _product(parts=[16, 32, 64], n_tile=[32, 64]),
    },
    "wide": {
        "rmsnorm_linear": _product(n_tile=[16, 32, 64], k_tile=[128, 256, 512]),
        "gated_mlp": _product(n_tile=[16, 32, 64], k_tile=[128, 256, 512]),
        "lora": _product(n_tile=[16, 32, 64], k_tile=[64, 128, 256, 512]),
        "adapter_mlp": [
            {"parts": p, "k_tile": 4096 // p // f, "n_tile": n}
            for p in (4, 8, 16, 32, 64) for n in (32, 64, 128) for f in (1, 2)
        ],
        "attention_flashdecoding": _product(
            parts=[2, 4, 8, 16], s_parts=[2, 4, 8, 16], n_tile=[32, 64, 128]
        ),
        "attention_mirage_gqa": _product(parts=[8, 16, 32, 64], n_tile=[32, 64, 128]),
    },
    "none": {},
}


def eager(graph):
    """The graph as plain PyTorch calls, without mugraph's input checks (a user's eager code)."""
    ops, outputs = graph.ops, graph.outputs

    def run(inputs):
        values = []
        for op in ops:
            if op.kind is OpKind.INPUT:
                values.append([inputs[op.attr("index")]])
            else:
                values.append([run_torch_op(op, [values[r.op][r.index] for r in op.inputs])])
        return [values[r.op][r.index] for r in outputs]

    return run


def floor_seconds(graph) -> tuple[float, str]:
    """max(bytes / bandwidth, flops / matmul rate) of the naive program, and which one."""
    moved = sum(t.num_bytes for t in graph.input_types) + sum(
        t.num_bytes for t in graph.output_types
    )
    flops = 0.0
    for op in graph.ops:
        if op.kind is OpKind.MATMUL:
            a = graph.tensor_type(op.inputs[0])
            flops += 2.0 * math.prod(op.outputs[0].dims) * a.dims[-1]
    t_mem, t_math = moved / BANDWIDTH, flops / MATMUL_RATE
    return (t_mem, "bytes") if t_mem >= t_math else (t_math, "flops")


def rel_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    out, ref = out.double(), ref.double()
    return float((out - ref).norm() / ref.norm().clamp_min(1e-30))


def rows(only: str | None):
    for name, w in WORKLOADS.items():
        if only and only != name:
            continue
        yield name, "suite", w, w.suite
        for label, sizes in w.extra.items():
            yield name, label, w, sizes


def _label(sizes: dict, base: dict) -> str:
    keys = [k for k in sizes if k not in ("m", "k", "n", "r", "h", "h_kv", "s", "d")]
    return ",".join(f"{k}={sizes[k]}" for k in keys) or "library"


def candidates(w, sizes: dict, choice: str):
    """(label, graph, sizes) of the library's sizes and each valid tile variant."""
    seen, out = set(), []
    variants = [{}] + list(TILE_CHOICES.get(choice, {}).get(w.name, []))
    for override in variants:
        trial = {**sizes, **override}
        key = tuple(sorted(trial.items()))
        if key in seen:
            continue
        seen.add(key)
        try:
            graph = w.optimized(trial)
        except Exception:  # noqa: BLE001 - not a valid tiling of these shapes
            continue
        out.append((_label(trial, sizes), graph, trial))
    return out


def _compile_baseline(base, inputs):
    """torch.compile (default mode) of the eager program, warmed up; (callable, error)."""
    try:
        torch._dynamo.reset()
        compiled = torch.compile(base)
        for _ in range(3):
            compiled(inputs)
        torch.cuda.synchronize()
        return (lambda c=compiled, x=inputs: c(x)), None
    except Exception as error:  # noqa: BLE001 - guard failures and the like: no baseline
        return None, f"{type(error).__name__}: {str(error).splitlines()[0][:120]}"


def kernel_times(program, inputs, reps: int) -> list[float]:
    """Each kernel of ``program`` timed alone (us, L2 flushed), through its fast-path launch."""
    from mugraph.runtime.compiled import _current_stream

    program(inputs=inputs)
    plan = program._plans.get(tuple(x.data_ptr() for x in inputs))
    if plan is None:
        return []
    fresh = [
        torch.empty_strided(sh, st, dtype=dt, device="cuda") for sh, st, dt in plan.fresh_specs
    ]
    times = []
    for launch, args, fills, direct in plan.launches:
        args = list(args)
        for pos, kind, k in fills:
            t = fresh[k] if kind == 0 else inputs[k]
            args[pos] = t.data_ptr() if direct else t
        stream = _current_stream(plan.device_index)
        m = profile_callable(lambda f=launch, a=args, s=stream: f(s, a), reps=reps)
        times.append(m.microseconds)
    return times


def _progress(line: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {line}", file=sys.stderr, flush=True)


def bench_gpu(args) -> list[dict]:
    """Three passes, so that nothing running in the background skews the timings: (1) per row,
    eager and the library's default program, then the tuning; (2) with the compile workers
    gone, the chosen programs beside eager again, the final numbers; (3) torch.compile."""
    from mugraph.codegen.check import random_inputs
    from mugraph.codegen.triton_gen import unrolled
    from mugraph.optimize import optimize_graphs
    from mugraph.optimize.precompile import shutdown
    from mugraph.runtime.compiled import compile_graph

    reps = args.reps
    print(f"device: {torch.cuda.get_device_name()}  torch {torch.__version__}  "
          f"triton {__import__('triton').__version__}  (median of {reps} runs, L2 flushed)",
          flush=True)
    results, work = [], []
    for name, label, w, sizes in rows(args.only):  # pass 1: tuning
        row = {"workload": name, "shapes": label}
        started = time.perf_counter()
        try:
            naive = w.naive(sizes)
            inputs = random_inputs(naive, torch.device("cuda"), seed=0, scale=0.5)
            base = eager(naive)
            floor, bound = floor_seconds(naive)
            row.update(floor_us=floor * 1e6, floor_bound=bound)
            library = w.optimized(sizes)
            default = compile_graph(library)
            row["default_us"] = profile_callable(
                lambda p=default, x=inputs: p(inputs=x), reps=reps).microseconds
            program, fused, row["variant"] = default, library, "library"
            if args.tune:
                cands = candidates(w, sizes, args.choices)
                result = optimize_graphs(
                    [(lbl, g) for lbl, g, _ in cands], inputs, keep=args.keep, check=False,
                    reps=20, warmup=6, budget=args.budget,
                    progress=_progress if args.progress else None,
                )
                program, fused, row["variant"] = result.program, result.graph, result.label
                row["tried"] = len(cands)
                row["screen"] = {lbl: m.microseconds for lbl, m in result.screen}
                row["trials"] = len(result.trials)
            row["launch"] = {
                str(i): {"num_warps": s.launch_config.num_warps,
                         "num_stages": s.launch_config.num_stages,
                         "unroll": unrolled(s.block, s.options),
                         "hoist": s.options.hoist_invariants}
                for i, s in program.steps.items()
            }
            row["est_us"] = estimate(fused).seconds * 1e6
            work.append((row, base, inputs, program))
        except Exception as error:  # noqa: BLE001 - report the row and go on
            row["status"] = f"ERROR {type(error).__name__}: {str(error).splitlines()[0][:160]}"
            traceback.print_exc(limit=4, file=sys.stderr)
        row["tune_seconds"] = time.perf_counter() - started
        results.append(row)
        write_results(results, args.out)
        _progress(f"tuned {name} {label}: {row.get('variant')} ({row['tune_seconds']:.0f} s)")
    shutdown()  # the compile workers (and their CUDA contexts) go before the final timings
    for row, base, inputs, program in work:  # pass 2: final timings
        try:
            reference = base(inputs)[0]
            err = rel_error(program(inputs=inputs)[0], reference)
            t_eager = profile_callable(lambda b=base, x=inputs: b(x), reps=reps)
            t_mg = profile_callable(lambda p=program, x=inputs: p(inputs=x), reps=reps)
            t_loop = profile_loop(lambda p=program, x=inputs: p(inputs=x))
            row.update(
                eager_us=t_eager.microseconds, mugraph_us=t_mg.microseconds,
                loop_us=t_loop.microseconds, rel_err=err,
                kernel_us=kernel_times(program, inputs, reps),
                fast_path=program.fast_path_note(), kernels=len(program.steps),
                blocks=[s.block.num_blocks for s in program.steps.values()],
            )
            status = "ok" if err < 1e-2 else "MISMATCH"
            for m, who in ((t_eager, "eager"), (t_mg, "mugraph")):
                if m.error:
                    status = f"{who} failed: {m.error[:80]}"
            row["status"] = status
        except Exception as error:  # noqa: BLE001
            row["status"] = f"ERROR {type(error).__name__}: {str(error).splitlines()[0][:160]}"
            traceback.print_exc(limit=4, file=sys.stderr)
    for row, base, inputs, _ in work:  # pass 3: torch.compile
        if args.compile:
            fn, error = _compile_baseline(base, inputs)
            if fn is not None:
                t_compile = profile_callable(fn, reps=reps)
                row["compile_us"] = t_compile.microseconds if t_compile.ok else None
                if not t_compile.ok:
                    row["compile_error"] = t_compile.error
            else:
                row["compile_error"] = error
        baselines = [row.get(k) for k in ("eager_us", "compile_us")]
        baselines = [b for b in baselines if b is not None and math.isfinite(b)]
        best = min(baselines) if baselines else float("nan")
        row["best_baseline_us"] = best
        mg = row.get("mugraph_us", float("nan"))
        row["speedup"] = best / mg if mg and math.isfinite(mg) else float("nan")
        print(json.dumps(row), flush=True)
        write_results(results, args.out)
    write_results(results, args.out)
    print_table(results)
    return results


def _fmt(value, width: int, digits: int = 1) -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return f"{'-':>{width}}"
    return f"{value:>{width}.{digits}f}"


COLUMNS = [
    ("workload", 24), ("shapes", 7), ("eager", 8), ("compile", 8), ("mugraph", 8),
    ("speedup", 8), ("floor", 7), ("default", 8), ("loop", 7), ("variant", 0),
]


def table_lines(results: list[dict]) -> list[str]:
    head = ("workload                shapes    eager  compile  mugraph  speedup  floor  "
            "default   loop  variant / status")
    lines = [head]
    for r in results:
        ok = r.get("status") == "ok"
        speed = f"{r['speedup']:>7.2f}x" if ok and math.isfinite(r.get("speedup", math.nan)) \
            else f"{'-':>8}"
        tail = r.get("variant", "") if ok else r.get("status", "")
        lines.append(
            f"{r['workload']:<24}{r['shapes']:<7}{_fmt(r.get('eager_us'), 8)}"
            f"{_fmt(r.get('compile_us'), 9)}{_fmt(r.get('mugraph_us'), 9)}{speed}"
            f"{_fmt(r.get('floor_us'), 7)}{_fmt(r.get('default_us'), 9)}{_fmt(r.get('loop_us'), 7)}"
            f"  {tail}"
        )
    return lines


def print_table(results: list[dict]) -> None:
    print("\nall times in us; speedup = best of eager/compile over mugraph; floor = max(bytes/"
          "3.0e12, flops/6.5e14); default = library sizes, default launch; loop = back-to-back "
          "calls without flush (host included)")
    print("\n".join(table_lines(results)), flush=True)


def write_results(results: list[dict], prefix: str | None) -> None:
    base = Path(prefix) if prefix else HERE / "results_handwritten"
    meta = {
        "device": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu",
        "torch": torch.__version__,
        "triton": __import__("triton").__version__,
        "method": "median of CUDA-event times, L2 flushed before each run",
        "floor": "max(bytes / 3.0e12, matmul flops / 6.5e14) of the naive program",
    }
    base.with_suffix(".json").write_text(json.dumps({"meta": meta, "rows": results}, indent=1))
    md = [
        f"# Hand-written μGraphs on {meta['device']} (torch {meta['torch']}, "
        f"triton {meta['triton']})",
        "",
        "Median of CUDA-event times with the L2 cache flushed before each run, in µs. speedup:",
        "best of eager / torch.compile over mugraph (tuned). floor: max(bytes / 3.0 TB/s,",
        "flops / 650 TFLOP/s). default: the library's sizes with default launch settings.",
        "loop: back-to-back calls without flush (host time included).",
        "",
        "| workload | shapes | eager | torch.compile | mugraph | speedup | floor | default "
        "| loop | variant / status |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |",
    ]
    for r in results:
        ok = r.get("status") == "ok"
        cells = [_fmt(r.get(k), 0) for k in ("eager_us", "compile_us", "mugraph_us")]
        speed = f"{r['speedup']:.2f}x" if ok and math.isfinite(r.get("speedup", math.nan)) \
            else "-"
        tail = r.get("variant", "") if ok else r.get("status", "")
        md.append(
            f"| {r['workload']} | {r['shapes']} | {' | '.join(c.strip() for c in cells)} | "
            f"{speed} | {_fmt(r.get('floor_us'), 0).strip()} | "
            f"{_fmt(r.get('default_us'), 0).strip()} | {_fmt(r.get('loop_us'), 0).strip()} | "
            f"{tail} |"
        )
    base.with_suffix(".md").write_text("\n".join(md) + "\n")


def bench_estimates(only: str | None) -> None:
    print("no CUDA device: cost model estimates (mugraph.optimize.estimate, H100)")
    print(f"{'workload':<26}{'shapes':<8}{'naive us':>10}{'fused us':>10}{'ratio':>8}"
          f"{'launches':>10}{'fused MB':>10}{'floor us':>10}")
    for name, label, w, sizes in rows(only):
        head = f"{name:<26}{label:<8}"
        try:
            naive, fused = estimate(w.naive(sizes)), estimate(w.optimized(sizes))
            floor, _ = floor_seconds(w.naive(sizes))
            print(f"{head}{naive.seconds * 1e6:>10.1f}{fused.seconds * 1e6:>10.1f}"
                  f"{naive.seconds / fused.seconds:>7.2f}x{naive.launches:>5}->{fused.launches:<4}"
                  f"{fused.dram_bytes / 1e6:>10.2f}{floor * 1e6:>10.1f}")
        except Exception as error:  # noqa: BLE001
            print(f"{head}  ERROR {type(error).__name__}: {str(error).splitlines()[0][:160]}")


def main(argv=None) -> None:
    cuda = torch.cuda.is_available()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=100)
    parser.add_argument("--only", default=None, help="one workload name")
    parser.add_argument("--tune", dest="tune", action="store_true", default=cuda,
                        help="profile μGraph and kernel variants first (default with CUDA)")
    parser.add_argument("--no-tune", dest="tune", action="store_false")
    parser.add_argument("--no-compile", dest="compile", action="store_false", default=True,
                        help="skip the torch.compile baseline")
    parser.add_argument("--choices", default="default", choices=sorted(TILE_CHOICES),
                        help="tile-size variants tried beside the library's (suite rows)")
    parser.add_argument("--keep", type=int, default=1, help="candidates tuned after screening")
    parser.add_argument("--budget", type=float, default=15.0,
                        help="seconds of tuning per row (after screening) before settling")
    parser.add_argument("--progress", action="store_true", help="log every trial to stderr")
    parser.add_argument("--out", default=None, help="path prefix of the .json / .md results")
    args = parser.parse_args(argv)
    if cuda:
        bench_gpu(args)
    else:
        bench_estimates(args.only)


if __name__ == "__main__":
    main()
