"""What does RoPE cost the persistent step? A bound, not a kernel anyone should run.

The attention bodies apply RoPE as ``x * cos + rotate_half(x) * sin``, with ``rotate_half`` a
small product of the rows viewed as halves (``layers.rotate``), which the code generator pads
for ``tl.dot`` and routes through per-program scratch in global memory (two stores, two loads
and four barriers per rotated tensor). ``no_rope`` replaces it by ``x * cos + x * sin`` — the
same loads, no rotation, wrong logits — so the difference in step time bounds what a rotation
without scratch could save::

    python benchmarks/probe_rope_cost.py --out $OUT/rope --models qwen3-0.6b llama-3.2-1b
"""

from __future__ import annotations

import argparse
from pathlib import Path

from benchmarks.bench_persistent import make_model
from benchmarks.probe_l2_resident import print_rows, time_step


def main(argv=None) -> int:
    import torch

    from mugraph.persistent import build_decoder, layers

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True)
    p.add_argument("--models", nargs="+", default=["qwen3-0.6b", "llama-3.2-1b"])
    p.add_argument("--trace", action="store_true", help="trace one step of each")
    p.add_argument("--calls", type=int, default=200)
    args = p.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows = {}
    rotate = layers.rotate
    for model_name in args.models:
        torch.manual_seed(0)
        model = make_model(model_name, None, "cuda", torch.bfloat16)
        for variant in ("default", "no_rope"):
            if variant == "no_rope":
                layers.rotate = lambda tb, x, cos, sin, pairs: tb.add(tb.mul(x, cos),
                                                                       tb.mul(x, sin))
            try:
                decoder = build_decoder(model, 1024)
            finally:
                layers.rotate = rotate
            name = f"{model_name}-{variant}"
            trace = out / f"{name}_trace.npz" if args.trace else None
            rows[name] = time_step(decoder, {}, args.calls, trace)
            print(name, rows[name]["persistent_us"], flush=True)
            del decoder
            torch.cuda.empty_cache()
        del model
    print_rows(out, rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
