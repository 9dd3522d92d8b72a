"""Do deeper register pipelines change a persistent kernel's logits on the GPU, and where?

The twenty-seventh session's call 3 and the twenty-eighth's call 2 measured Llama-3.2-1B's
teacher-forced logits 7-8% away from a float32 model with ``pipeline_depth`` 2 / 3 (or, in
the latter, 3 blocks ahead in the long kernels only: a throwaway option), against 2% with
the default, in some calls and not in others. (The cause was a race between two bodies'
scratch, fixed since: ``probe_race.py`` found it; see RESULTS.md, twenty-eighth session.)
This probe compiles the same decoder with static tiles 1 (the default) or ``d`` blocks ahead
in the bodies of chosen kernels (``--variant NAME=REGEX:DEPTH``, REGEX matched against the
kernel's label), teacher-forces the same tokens through each twice, and prints per variant
and run: the relative error of the logits against the default's first run (median, max, the
first step above 1e-3) and whether two runs agree bit for bit::

    python benchmarks/probe_pipeline_parity.py --variant gate_up=gate_up:3 down=mlp.down:3
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

from benchmarks.bench_persistent import make_model, teacher_forced


def patched_depth(regex: str | None, depth: int):
    """``codegen.pipeline_depth`` with ``depth`` for the kernels whose label matches."""
    from mugraph.persistent import codegen

    original = codegen.pipeline_depth

    def choose(spec, ahead, options):
        if regex is not None and re.search(regex, spec.label):
            from dataclasses import replace

            return original(spec, ahead, replace(options, pipeline_depth=depth))
        return original(spec, ahead, options)

    return original, choose


def parse_variant(text: str) -> tuple[str, str, int]:
    """``NAME=REGEX:DEPTH`` as (name, regex, depth)."""
    name, rest = text.split("=", 1)
    regex, depth = rest.rsplit(":", 1)
    return name, regex, int(depth)


def compile_with_depth(decoder, regex: str | None, depth: int):
    """``decoder.compile()`` with static tiles ``depth`` blocks ahead in the bodies of the
    kernels whose label matches ``regex`` (None: the default everywhere)."""
    from mugraph.persistent import codegen

    original, choose = patched_depth(regex, depth)
    codegen.pipeline_depth = choose
    try:
        return decoder.compile()
    finally:
        codegen.pipeline_depth = original


def main(argv=None) -> int:
    import torch

    from mugraph.persistent import build_decoder

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default=None)
    p.add_argument("--model", default="llama-3.2-1b")
    p.add_argument("--layers", type=int, default=None)
    p.add_argument("--steps", type=int, default=24)
    p.add_argument("--variant", nargs="*", default=[], help="NAME=REGEX:DEPTH")
    args = p.parse_args(argv)
    torch.manual_seed(0)
    cuda = torch.cuda.is_available()  # else tiny models in the interpreter (a smoke test)
    model = make_model(args.model, args.layers, "cuda" if cuda else "cpu",
                       torch.bfloat16 if cuda else torch.float32)
    feed = torch.randint(0, model.config.vocab_size, (args.steps,)).tolist()
    decoder = build_decoder(model, 1024 if cuda else 64)
    variants = [("default", None, 1)] + [parse_variant(text) for text in args.variant]
    rows, base = [], None
    with torch.no_grad():
        for name, regex, depth in variants:
            program = compile_with_depth(decoder, regex, depth)
            logits_buf = program.buffer(decoder.logits)
            runs = [teacher_forced(program, logits_buf, feed, 0) for _ in range(2)]
            if base is None:
                base = runs[0]
            for r, run in enumerate(runs):
                errs = [float((a - b).norm() / b.norm()) for a, b in zip(run, base, strict=True)]
                bad = next((i for i, e in enumerate(errs) if e > 1e-3), None)
                same = all(torch.equal(a, b) for a, b in zip(run, runs[0], strict=True))
                rows.append({
                    "variant": name, "run": r, "median_err": sorted(errs)[len(errs) // 2],
                    "max_err": max(errs), "first_step_over_1e-3": bad,
                    "equal_to_run0": same,
                    "spills": (getattr(program, "resources", None) or {}).get("spills"),
                    "source_lines": len(program.source.splitlines()),
                })
                print(json.dumps(rows[-1]), flush=True)
            del program
    report(args.out, "parity.json", rows, {
        "variant": "{variant}", "run": "{run}", "median err": "{median_err:.2e}",
        "max err": "{max_err:.2e}", "first step > 1e-3": "{first_step_over_1e-3}",
        "= run 0": "{equal_to_run0}", "spills": "{spills}",
    })
    return 0


def report(out: str | None, filename: str, rows: list[dict], columns: dict[str, str]) -> None:
    """``rows`` as JSON in ``out``/``filename`` (when ``out`` is given), then as a table whose
    columns are titled by ``columns``' keys and filled by its format strings."""
    if out:
        Path(out).mkdir(parents=True, exist_ok=True)
        (Path(out) / filename).write_text(json.dumps(rows, indent=1))
    print("| " + " | ".join(columns) + " |")
    print("|" + " --- |" * len(columns))
    for r in rows:
        print("| " + " | ".join(f.format(**r) for f in columns.values()) + " |")


if __name__ == "__main__":
    raise SystemExit(main())
