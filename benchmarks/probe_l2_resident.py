"""How fast would a persistent decode step be with each layer's weights already in L2?

Not a benchmark of anything a user runs: a bound for an idea. The Qwen3-0.6B-shaped model
(bfloat16, random weights) is built as in ``bench_persistent.py``, then layers 1.. are made to
share layer 0's weight tensors (``build_decoder`` attaches a tensor once, so the kernel reads
one copy: about 30 MB a layer, which stays in the H100's 50 MB L2 from one layer to the next).
The KV caches and the LM head stay distinct. Variants share all of a layer's weights, only the
MLP's or only the attention's, some with a task's first blocks loaded before its wait
(``pipeline_depth``); ``distinct`` is the model as it is. Each is timed as the table's
persistent column is (``program.launch`` from a CUDA graph, median of 3)::

    python benchmarks/probe_l2_resident.py --out $OUT/l2 --variants distinct shared_all
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from benchmarks.bench_persistent import make_model, save_trace, time_replayed, trace_summary

ALL = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
SHARED = {  # name: (the projections layers 1.. share with layer 0, compile options)
    "distinct": ((), {}),
    "shared_all": (ALL, {}),
    "shared_mlp": (("gate_proj", "up_proj", "down_proj"), {}),
    "shared_attn": (("q_proj", "k_proj", "v_proj", "o_proj"), {}),
    # with every block of a task's weights loaded before its wait (3 blocks ahead)
    "distinct_depth3": ((), {"pipeline_depth": 3}),
    "shared_all_depth2": (ALL, {"pipeline_depth": 2}),
    "shared_all_depth3": (ALL, {"pipeline_depth": 3}),
}


def share(model, names) -> None:
    """Layers 1.. take layer 0's Parameter objects for the projections in ``names``."""
    layers = model.model.layers
    for layer in layers[1:]:
        for name in names:
            pairs = ((layer.self_attn, layers[0].self_attn), (layer.mlp, layers[0].mlp))
            for module, first in pairs:
                if hasattr(module, name):
                    getattr(module, name).weight = getattr(first, name).weight


def main(argv=None) -> int:
    import torch

    from mugraph.persistent import build_decoder

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True)
    p.add_argument("--model", default="qwen3-0.6b")
    p.add_argument("--variants", nargs="+", default=list(SHARED), choices=sorted(SHARED))
    p.add_argument("--trace", nargs="*", default=[], help="variants to trace one step of")
    p.add_argument("--calls", type=int, default=200)
    args = p.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows = {}
    for name in args.variants:
        torch.manual_seed(0)
        model = make_model(args.model, None, "cuda", torch.bfloat16)
        shared, options = SHARED[name]
        share(model, shared)
        decoder = build_decoder(model, 1024)
        trace = out / f"{args.model}-{name}_trace.npz" if name in args.trace else None
        rows[name] = time_step(decoder, options, args.calls, trace)
        print(name, json.dumps(rows[name]), flush=True)
        del decoder, model
        torch.cuda.empty_cache()
    print_rows(out, rows)
    return 0


def time_step(decoder, options: dict, calls: int, trace: Path | None = None) -> dict:
    """µs per step of ``decoder.compile(**options)`` replayed from a CUDA graph (as the
    table's persistent column), after 8 steps, the rest of the caches random; with ``trace``,
    a traced step's summary too (its stamps saved there)."""
    import torch

    program = decoder.compile(**options)
    with torch.no_grad():
        for tok in range(8):
            program.step(tok)
        us = time_replayed(program, decoder, calls) * 1e6
    row = {"persistent_us": round(us, 1)}
    if trace is not None:
        traced = decoder.compile(**options, trace=True, cuda_graph=False)
        traced.step(1)
        traced.step(2)
        torch.cuda.synchronize()
        row["trace"] = trace_summary(traced)
        save_trace(traced, trace)
    return row


def print_rows(out: Path, rows: dict) -> None:
    """``rows`` (variant: row) into ``out``/results.json, then as a table."""
    (out / "results.json").write_text(json.dumps(rows, indent=1))
    print("| variant | µs per step |\n| --- | --- |")
    for name, row in rows.items():
        print(f"| {name} | {row['persistent_us']} |")


if __name__ == "__main__":
    raise SystemExit(main())
