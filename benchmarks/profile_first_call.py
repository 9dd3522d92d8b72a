"""Where the first call of a compiled model goes: ``cProfile`` of the mugraph backend's
first prefill (or decode) call of ``bench_models``'s Llama-3.2-1B-sized model.

    python benchmarks/profile_first_call.py --cache-dir DIR [--layers 2] [--phase prefill]
        [--rows 40]

Prints the functions taking the most cumulative time (mugraph's and PyTorch's), so that a
slow warm first call (every choice taken from the cache) can be taken apart.
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))


def main() -> None:
    import torch

    from benchmarks.bench_models import compiled_model
    from benchmarks.profile_models import _phase_fn, model_and_inputs

    parser = argparse.ArgumentParser()
    parser.add_argument("--cache-dir", default=None)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--phase", default="prefill", choices=["prefill", "decode"])
    parser.add_argument("--tokens", type=int, default=512)
    parser.add_argument("--kv", type=int, default=1024)
    parser.add_argument("--rows", type=int, default=40)
    args = parser.parse_args()
    model, ids, cache0, token, options = model_and_inputs(args)
    compiled = compiled_model(model, "mugraph", options)
    fn = _phase_fn(compiled, args.phase, args, ids, cache0, token)
    profiler = cProfile.Profile()
    started = time.perf_counter()
    with torch.no_grad():
        profiler.enable()
        fn()
        torch.cuda.synchronize()
        profiler.disable()
    print(f"first {args.phase} call: {time.perf_counter() - started:.1f} s")
    stats = pstats.Stats(profiler)
    stats.sort_stats("cumulative").print_stats(args.rows)
    stats.sort_stats("tottime").print_stats(args.rows // 2)


if __name__ == "__main__":
    main()
