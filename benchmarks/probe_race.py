"""Which task of a persistent step computes a different value from the same inputs?

Teacher-forces the same tokens through one compiled decoder several times and keeps, after
every step, every intermediate buffer of the kernel and the cache rows the step appended.
Run 0 is the reference: for each other run and step, the first tensor (in the kernel graph's
order, a topological order) that differs from run 0's names the kernel that computed a
different value while its producers' values were equal — a race on what it read, or a
nondeterministic computation. ``--variant`` takes ``probe_pipeline_parity``'s NAME=REGEX:DEPTH
(static tiles ``DEPTH`` blocks ahead in the matching kernels)::

    python benchmarks/probe_race.py --runs 8 --variant all2=.:2
"""

from __future__ import annotations

import argparse
import json

from benchmarks.bench_persistent import make_model
from benchmarks.probe_pipeline_parity import compile_with_depth, parse_variant, report


def snapshot(program, decoder, pos: int) -> list[tuple[str, object]]:
    """(label, copy) of every buffer in graph order, then the cache rows at ``pos``."""
    labels = {s.op: s.label for s in program.specs}
    out = []
    for (k, j), buf in sorted(program.buffers.items()):
        tensors = buf if isinstance(buf, (list, tuple)) else [buf]
        for n, t in enumerate(tensors):
            out.append((f"{labels.get(k, k)}[{j}]{'/' + str(n) if len(tensors) > 1 else ''}",
                        t.clone()))
    for i, (kc, vc) in enumerate(zip(decoder.k_caches, decoder.v_caches, strict=True)):
        out.append((f"layer{i}.k_cache[pos]", kc[pos].clone()))
        out.append((f"layer{i}.v_cache[pos]", vc[pos].clone()))
    return out


def run_once(program, decoder, feed) -> list[list[tuple[str, object]]]:
    import torch

    program.reset()
    steps = []
    for pos, tok in enumerate(feed):
        program.step(tok)
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        steps.append(snapshot(program, decoder, pos))
    program.check_errors()
    return steps


def first_difference(ref, other):
    for (label, a), (_, b) in zip(ref, other, strict=True):
        if not a.equal(b):
            diff = (a.float() - b.float()).abs()
            return label, float(diff.max()), int((diff > 0).sum()), a.numel()
    return None


def main(argv=None) -> int:
    import torch

    from mugraph.persistent import build_decoder

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default=None)
    p.add_argument("--model", default="llama-3.2-1b")
    p.add_argument("--steps", type=int, default=24)
    p.add_argument("--runs", type=int, default=6)
    p.add_argument("--variant", nargs="*", default=["default=nomatch:1"])
    args = p.parse_args(argv)
    torch.manual_seed(0)
    cuda = torch.cuda.is_available()  # else a tiny model in the interpreter (a smoke test)
    model = make_model(args.model, None, "cuda" if cuda else "cpu",
                       torch.bfloat16 if cuda else torch.float32)
    feed = torch.randint(0, model.config.vocab_size, (args.steps,)).tolist()
    decoder = build_decoder(model, 1024 if cuda else 64)
    found = []
    with torch.no_grad():
        for text in args.variant:
            name, regex, depth = parse_variant(text)
            program = compile_with_depth(decoder, regex, depth)
            ref = run_once(program, decoder, feed)
            glitches = 0
            for r in range(1, args.runs):
                run = run_once(program, decoder, feed)
                for step, (a, b) in enumerate(zip(ref, run, strict=True)):
                    d = first_difference(a, b)
                    if d is not None:
                        glitches += 1
                        row = {"variant": name, "run": r, "step": step, "tensor": d[0],
                               "max_abs_diff": d[1], "elements_differing": d[2],
                               "elements": d[3]}
                        found.append(row)
                        print(json.dumps(row), flush=True)
                        break  # later steps inherit the difference through the caches
                del run
            print(f"{name}: {glitches} of {args.runs - 1} runs differ from run 0", flush=True)
            del program, ref
            torch.cuda.empty_cache()
    report(args.out, "race.json", found, {
        "variant": "{variant}", "run": "{run}", "step": "{step}",
        "first differing tensor": "{tensor}", "max abs diff": "{max_abs_diff:.3g}",
        "differing / elements": "{elements_differing} / {elements}",
    })
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
