"""The persistent kernel compiled for the H100 without one: registers, spills, load widths.

    python benchmarks/probe_persistent_offline.py [--models qwen3-0.6b llama-3.2-1b]
        [--layers 1] [--warps 4] [--variants default unaligned no_pipeline] [--per-body]
        [--attention-chunk 64] [--maxnreg 168] [--fuse-mlp] [--by-role gate_up:16:64]

Builds ``bench_persistent``'s model shapes (random bfloat16 weights on the CPU, ``--layers``
decoder layers: every layer has the same bodies), generates the persistent module in GPU mode
and compiles it for sm_90a with this Triton's own ptxas (``triton.compile`` with a CUDA
target: no GPU needed). Prints, per model and variant, the registers, the stack bytes
(spills), the shared memory, and the global loads by width from the SASS (``cuobjdump``):
``LDG.E.EF.U16`` is a two-byte load of a streamed weight, ``LDG.E.EF.128`` a sixteen-byte one.
``--per-body`` compiles each task body alone as well.

The numbers are indicative: the H100 machine runs another Triton (3.6), which allocates
registers differently; what a GPU run measures decides.
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import importlib.util
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

os.environ.pop("TRITON_INTERPRET", None)  # GPU-mode source, compiled, never run
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

VARIANTS = {  # PersistentOptions beyond the GPU mode's defaults (aligned and pipelined)
    "default": {},
    "unaligned": {"align_hints": False},
    "no_pipeline": {"pipeline": False},
    "no_dot_pipeline": {"pipeline_dots": False},
    "separate_bodies": {"separate_bodies": True},
    "plain_ladder": {"prefetch_ahead": False},
    "depth2": {"pipeline_depth": 2},
    "depth3": {"pipeline_depth": 3},
    # two / three 32 KB blocks held ahead (the program-set variants of bench_persistent)
    "depth2_64k": {"pipeline_depth": 2, "pipeline_bytes": 64 * 1024},
    "depth3_96k": {"pipeline_depth": 3, "pipeline_bytes": 96 * 1024},
    "depth2_64k_first_early": {"pipeline_depth": 2, "pipeline_bytes": 64 * 1024,
                               "first_block_early": True},
    "s17_default": {"align_hints": False, "pipeline": False},
    "lookahead": {"lookahead": True},
    "no_early": {"early_static": False},
    "no_loads_first": {"loads_first": False},
    "first_block_early": {"first_block_early": True},
    "separate_first_early": {"separate_bodies": True, "first_block_early": True},
    "scratch_reshapes": {"align_reshapes": False},  # reshapes as before the 39th session
    "separate_dot_pipeline": {"separate_bodies": True, "pipeline_dots": True},
    "late_triggers": {"early_triggers": False},
    "queue_entries": {"desc_by_position": False},
    "claims": {"claim_field": 0},  # (the field is the one after the addresses: set below)
    "l2_stream": {"stream_field": 0},  # (likewise)
}
SIGNATURE = {  # the dispatcher's arguments (codegen.DISPATCH_SIG)
    "desc_ptr": "*i64",
    "queue_ptr": "*i32",
    "qstart_ptr": "*i32",
    "evt_ptr": "*i32",
    "trig_ptr": "*i32",
    "meta_ptr": "*i32",
    "scratch_ptr": "*fp32",
    "trace_ptr": "*i64",
}
LOAD = re.compile(r"\s(LDG[.\w]*)")
LOAD_BYTES = {"U8": "1", "S8": "1", "U16": "2", "S16": "2", "64": "8", "128": "16"}  # else 4


def compile_module(
    text: str, name: str, warps: int, maxnreg: int | None = None
) -> tuple[dict, collections.Counter]:
    """Resources and load counts of the kernel ``name`` defined by ``text``, for sm_90a
    (``maxnreg``: the register cap the compiler must fit, spilling what does not)."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    folder = tempfile.mkdtemp(prefix="mg_offline_")
    path = os.path.join(folder, "module.py")
    Path(path).write_text(text)
    spec = importlib.util.spec_from_file_location("mg_offline_module", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert set(SIGNATURE) == set(module.__dict__[name].arg_names)
    compiled = triton.compile(
        ASTSource(getattr(module, name), SIGNATURE, {}),
        target=GPUTarget("cuda", 90, 32),
        options={"num_warps": warps, "num_stages": 1,
                 **({"maxnreg": maxnreg} if maxnreg else {})},
    )
    cubin = os.path.join(folder, "kernel.cubin")
    Path(cubin).write_bytes(compiled.asm["cubin"])
    tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    usage = subprocess.run([tool, "--dump-resource-usage", cubin], capture_output=True,
                           text=True, check=True).stdout
    sass = subprocess.run([tool, "-sass", cubin], capture_output=True, text=True,
                          check=True).stdout

    def field(key: str) -> int:
        found = re.search(rf"{key}:(\d+)", usage)
        return int(found.group(1)) if found else 0

    resources = {"registers": field("REG"), "stack": field("STACK"),
                 "shared": int(compiled.metadata.shared)}
    return resources, collections.Counter(LOAD.findall(sass))


def widths(loads: collections.Counter) -> str:
    """Weight loads (evict-first) and all global loads by width, in bytes."""
    def width(op: str) -> str:
        suffixes = op.split(".")
        return next((b for s, b in LOAD_BYTES.items() if s in suffixes), "4")

    streamed, every = collections.Counter(), collections.Counter()
    for op, n in loads.items():
        every[width(op)] += n
        if ".EF" in op:
            streamed[width(op)] += n
    show = lambda c: " ".join(f"{n}x{w}B" for w, n in sorted(c.items(), key=lambda x: int(x[0])))  # noqa: E731
    return f"weights {show(streamed) or '-'}; all {show(every)}"


def main(argv=None) -> int:
    import torch
    from bench_persistent import make_model

    from mugraph.persistent import TilePolicy, build_decoder
    from mugraph.persistent.codegen import PersistentOptions, generate_program
    from mugraph.persistent.runtime import (
        KERNEL_NAME,
        descriptor_width,
        kernel_specs,
        program_source,
        task_bodies,
    )

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", nargs="+", default=["qwen3-0.6b", "llama-3.2-1b"])
    p.add_argument("--layers", type=int, default=1)
    p.add_argument("--warps", type=int, default=4)
    p.add_argument("--variants", nargs="+", default=["default", "s17_default"],
                   choices=sorted(VARIANTS))
    p.add_argument("--per-body", action="store_true")
    p.add_argument("--maxnreg", type=int, default=None,
                   help="cap the registers per thread (PersistentProgram(max_registers=...))")
    p.add_argument("--attention-chunk", type=int, default=TilePolicy.attention_chunk,
                   help="cached positions per attention block (TilePolicy.attention_chunk)")
    p.add_argument("--by-role", nargs="*", default=[], metavar="ROLE:KB:BLOCKS",
                   help="TilePolicy.by_role entries, e.g. gate_up:16:64")
    p.add_argument("--fuse-mlp", action="store_true",
                   help="each MLP one kernel summed over blocks (TilePolicy.fuse_mlp_down)")
    args = p.parse_args(argv)
    by_role = tuple((role, int(kb) * 1024, int(blocks)) for role, kb, blocks in
                    (entry.split(":") for entry in args.by_role))
    tiles = TilePolicy(attention_chunk=args.attention_chunk, fuse_mlp_down=args.fuse_mlp,
                       by_role=by_role)
    rows = []
    for model_name in args.models:
        model = make_model(model_name, args.layers, "cpu", torch.bfloat16)
        decoder = build_decoder(model, 1024, tiles=tiles)
        specs = kernel_specs(decoder.kernel)
        for variant in args.variants:
            options = PersistentOptions(interpret=False, **VARIANTS[variant])
            if options.claims:  # the runtime's place for a task's block counter
                options = dataclasses.replace(options, claim_field=descriptor_width(specs))
            if options.streams:  # the runtime's place for a task's stream ranges
                options = dataclasses.replace(options, stream_field=descriptor_width(specs))
            res, loads = compile_module(program_source(specs, options), KERNEL_NAME, args.warps,
                                       args.maxnreg)
            rows.append((model_name, variant, "whole kernel", res, widths(loads)))
            print(*rows[-1], flush=True)
            if not args.per_body:
                continue
            _, bodies = task_bodies(specs, options)
            for body in bodies:
                text = generate_program([body], descriptor_width(specs), KERNEL_NAME, options)
                res, loads = compile_module(text, KERNEL_NAME, args.warps, args.maxnreg)
                rows.append((model_name, variant, ", ".join(body.kernels)[:40], res,
                             widths(loads)))
                print(*rows[-1], flush=True)
    print(f"\n| model | variant | body | registers | stack B | shared B | global loads "
          f"({args.warps} warps, sm_90a) |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for model_name, variant, body, res, text in rows:
        print(f"| {model_name} | {variant} | {body} | {res['registers']} | {res['stack']} | "
              f"{res['shared']} | {text} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
