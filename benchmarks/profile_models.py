"""Where a prefill's time goes: the Llama-3.2-1B-sized model of ``bench_models`` under
``torch.compile`` (Inductor) and ``backend="mugraph"``, profiled with ``torch.profiler``.

    python benchmarks/profile_models.py --cache-dir DIR [--layers 4] [--tokens 512]

For each mode: the wall time of a prefill (CUDA events, median of 5), the GPU kernels' summed
time in one profiled prefill, and the operators / kernels taking the most time, so that
launch overhead (wall well above the kernels' sum) and slow kernels can be told apart.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))


def main() -> None:
    import torch
    from torch.profiler import ProfilerActivity, profile

    from benchmarks.bench_models import LLAMA_1B, build, compiled_model, prefill_fn, timed

    parser = argparse.ArgumentParser()
    parser.add_argument("--cache-dir", default=None)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--tokens", type=int, default=512)
    parser.add_argument("--modes", default="torch.compile,mugraph")
    parser.add_argument("--rows", type=int, default=18)
    args = parser.parse_args()
    sizes = dict(LLAMA_1B, num_hidden_layers=args.layers)
    model = build(sizes, torch.float16, "cuda")
    ids = torch.randint(0, sizes["vocab_size"], (1, args.tokens), device="cuda")
    options = {"time_limit": 60, "cache_dir": args.cache_dir, "rest": "inductor"}
    summary = []
    for mode in args.modes.split(","):
        fn = prefill_fn(compiled_model(model, mode, options), ids)
        with torch.no_grad():
            fn()
            wall = timed(fn, 5, True)
            torch.cuda.synchronize()
            with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
                fn()
                torch.cuda.synchronize()
        events = prof.key_averages()
        gpu_ms = sum(e.self_device_time_total for e in events) / 1e3
        launches = sum(e.count for e in events if e.self_device_time_total > 0)
        print(f"\n=== {mode}: prefill {wall:.3f} ms wall; GPU kernels {gpu_ms:.3f} ms in one "
              f"profiled prefill ({launches} kernel launches)")
        print(events.table(sort_by="self_device_time_total", row_limit=args.rows,
                           max_name_column_width=60))
        print(events.table(sort_by="self_cpu_time_total", row_limit=args.rows,
                           max_name_column_width=60))
        summary.append((mode, wall, gpu_ms, launches))
    print("\n| mode | prefill wall ms | GPU kernels ms | launches |\n| --- | --- | --- | --- |")
    for mode, wall, gpu_ms, launches in summary:
        print(f"| {mode} | {wall:.3f} | {gpu_ms:.3f} | {launches} |")


if __name__ == "__main__":
    main()
