"""Are a persistent step's sums over blocks the same from run to run, but for the order of
their float32 additions? (GPU)

    python benchmarks/probe_summed_rows.py [--model llama-3.2-1b] [--steps 6] [--runs 3]

Builds ``bench_persistent``'s model shape (random bfloat16 weights) with
``TilePolicy(fuse_mlp_down=True)``, feeds the same tokens ``--runs`` times (``reset()`` between
runs) and prints, per run and step, the largest relative difference of every layer's summed
down-projection row and of the logits against the first run, and the logits' relative error
against an unfused program's. Atomic additions in another order change a float32 sum in its
last bits; a read that races a write would change it far more.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))


def main(argv=None) -> int:
    import torch
    from bench_persistent import make_model

    from mugraph.persistent import TilePolicy, build_decoder

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="llama-3.2-1b")
    p.add_argument("--layers", type=int, default=None)
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--runs", type=int, default=3)
    args = p.parse_args(argv)
    torch.manual_seed(0)
    model = make_model(args.model, args.layers, "cuda", torch.bfloat16)
    tokens = [int(t) for t in torch.randint(0, model.config.vocab_size, (args.steps,))]
    plain = build_decoder(model, 1024)
    fused = build_decoder(model, 1024, tiles=TilePolicy(fuse_mlp_down=True))
    sums = [t for t in fused.kernel.tensors.values() if t.name.endswith(".down_sum")]

    def run(decoder, with_sums: bool):
        program = decoder.compile()
        program.reset()
        out = []
        for tok in tokens:
            program.step(tok)
            rows = [program.buffer(t).float().clone() for t in sums] if with_sums else []
            out.append((program.buffer(decoder.logits).float().clone(), rows))
        program.check_errors()
        return out

    def rel(a, b):
        return float((a - b).abs().max() / b.abs().max().clamp_min(1e-30))

    reference = run(plain, False)
    first = None
    for r in range(args.runs):
        got = run(fused, True)
        first = first or got
        errs, layer0 = [], []
        for s, ((logits, rows), (ref_logits, _), (l0, rows0)) in enumerate(
            zip(got, reference, first, strict=True)
        ):
            diffs = [rel(a, b) for a, b in zip(rows, rows0, strict=True)]
            err = float((logits - ref_logits).norm() / ref_logits.norm())
            errs.append(err)
            layer0.append(diffs[0] if diffs else 0.0)
            if args.steps <= 10:
                layers = " ".join(f"{d:.0e}" for d in diffs[:4])
                print(f"run {r} step {s}: sums vs run 0, first layers {layers}, worst "
                      f"{max(diffs, default=0.0):.2e}; logits vs run 0 {rel(logits, l0):.2e}, "
                      f"vs unfused {err:.4f}", flush=True)
        ordered = sorted(errs)
        halves = [sorted(errs[:64]), sorted(errs[64:])]
        medians = " / ".join(f"{h[len(h) // 2]:.4f}" for h in halves if h)
        print(f"run {r}: logits vs unfused median {ordered[len(ordered) // 2]:.4f} (positions "
              f"0-63 / 64 on: {medians}), max "
              f"{ordered[-1]:.4f} (step {errs.index(ordered[-1])}); layer 0's sum vs run 0 at "
              f"most {max(layer0):.1e}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
