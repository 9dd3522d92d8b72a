"""Where a prefill's or a decode step's time goes: the Llama-3.2-1B-sized model of
``bench_models`` under ``torch.compile`` (Inductor) and ``backend="mugraph"``, profiled with
``torch.profiler`` (and, with ``--python``, ``cProfile`` for the host's Python time).

    python benchmarks/profile_models.py --cache-dir DIR [--layers 4] [--tokens 512]
        [--phases prefill,decode] [--kv 1024] [--python]

For each mode and phase: the wall time (CUDA events, median of 5), the GPU kernels' summed
time in one profiled call, and the operators / kernels taking the most time, so that launch
overhead (wall well above the kernels' sum) and slow kernels can be told apart.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))


def _phase_fn(model, phase: str, args, ids, cache0, token):
    import copy

    from benchmarks.bench_models import decode_fn, prefill_fn

    if phase == "prefill":
        return prefill_fn(model, ids)
    return decode_fn(model, copy.deepcopy(cache0), token, args.kv)


def model_and_inputs(args):
    """(model, prompt ids, decode cache, decode token, backend options) for ``args``'s
    ``layers``, ``tokens``, ``kv`` and ``cache_dir``: bench_models's model, on the GPU."""
    import torch

    from benchmarks.bench_models import LLAMA_1B, build, decode_setup

    sizes = dict(LLAMA_1B, num_hidden_layers=args.layers)
    model = build(sizes, torch.float16, "cuda")
    ids = torch.randint(0, sizes["vocab_size"], (1, args.tokens), device="cuda")
    cache0, token = decode_setup(model, args.kv, sizes["vocab_size"], "cuda")
    options = {"time_limit": 60, "cache_dir": args.cache_dir, "rest": "inductor"}
    return model, ids, cache0, token, options


def _python_profile(fn, rows: int) -> str:
    """The top Python functions (own time) of one call of ``fn``."""
    import torch

    profiler = cProfile.Profile()
    profiler.enable()
    fn()
    torch.cuda.synchronize()
    profiler.disable()
    text = io.StringIO()
    pstats.Stats(profiler, stream=text).sort_stats("tottime").print_stats(rows)
    return text.getvalue()


def main() -> None:
    import torch
    from torch.profiler import ProfilerActivity, profile

    import mugraph.integration as mgi
    from benchmarks.bench_models import compiled_model, timed

    parser = argparse.ArgumentParser()
    parser.add_argument("--cache-dir", default=None)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--tokens", type=int, default=512)
    parser.add_argument("--kv", type=int, default=1024)
    parser.add_argument("--phases", default="prefill")
    parser.add_argument("--modes", default="torch.compile,mugraph")
    parser.add_argument("--rows", type=int, default=18)
    parser.add_argument("--python", action="store_true", help="also cProfile one call")
    args = parser.parse_args()
    model, ids, cache0, token, options = model_and_inputs(args)
    summary = []
    for mode in args.modes.split(","):
        compiled = compiled_model(model, mode, options)
        mgi.clear_reports()
        for phase in args.phases.split(","):
            fn = _phase_fn(compiled, phase, args, ids, cache0, token)
            with torch.no_grad():
                fn()
                wall = timed(fn, 5, True)
                torch.cuda.synchronize()
                with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
                    fn()
                    torch.cuda.synchronize()
                python = _python_profile(fn, args.rows) if args.python else ""
            events = prof.key_averages()
            gpu_ms = sum(e.self_device_time_total for e in events) / 1e3
            launches = sum(e.count for e in events if e.self_device_time_total > 0)
            print(f"\n=== {mode} {phase}: {wall:.3f} ms wall; GPU kernels {gpu_ms:.3f} ms in "
                  f"one profiled call ({launches} kernel launches)")
            print(events.table(sort_by="self_device_time_total", row_limit=args.rows,
                               max_name_column_width=60))
            print(events.table(sort_by="self_cpu_time_total", row_limit=args.rows,
                               max_name_column_width=60))
            print(python)
            summary.append((mode, phase, wall, gpu_ms, launches))
        if mode == "mugraph":
            for report in mgi.reports():
                print(report.format())
    print("\n| mode | phase | wall ms | GPU kernels ms | launches |\n"
          "| --- | --- | --- | --- | --- |")
    for mode, phase, wall, gpu_ms, launches in summary:
        print(f"| {mode} | {phase} | {wall:.3f} | {gpu_ms:.3f} | {launches} |")


if __name__ == "__main__":
    main()
