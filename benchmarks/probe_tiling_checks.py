"""Checking the tilings of one projection again and again on the GPU (a probe).

    python benchmarks/probe_tiling_checks.py --cache-dir DIR --module "norm + qkv" --rows 512 \
        --grid 8 24 [--seeds 8]

Compiles the module of ``benchmarks/probe_tilings.py`` with ``backend="mugraph"`` to reach
its partition's tiler, then, for every tiling whose grid is ``--grid`` (parts per grid index,
in order) and each launch setting (the default and :func:`mugraph.optimize.tune.launch_variants`),
compares the compiled program with the reference semantics on ``--seeds`` random input sets
(``check_against_reference``) and runs it six times on the same inputs (equal bits?);
``--no-split`` compiles without the second load of mixed tiles
(``CodegenOptions.split_mixed_loads``). Prints, per tiling and setting, the failures out
of the seeds, whether repeated runs agree, and the time.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))


def main(argv=None) -> None:
    import probe_tilings
    import torch

    import mugraph.integration  # noqa: F401 - registers the backend
    from mugraph.codegen.check import CodegenMismatchError, check_against_reference, random_inputs
    from mugraph.codegen.launch import default_launch
    from mugraph.integration import dynamo
    from mugraph.integration.runtime import cuda_mean_milliseconds
    from mugraph.ir.ops import OpKind
    from mugraph.optimize.tune import launch_variants
    from mugraph.runtime.compiled import compile_graph

    parser = argparse.ArgumentParser()
    parser.add_argument("--cache-dir", default=None)
    parser.add_argument("--module", default="norm + qkv")
    parser.add_argument("--rows", type=int, default=512)
    parser.add_argument("--grid", type=int, nargs="+", required=True)
    parser.add_argument("--seeds", type=int, default=8)
    parser.add_argument("--default-only", action="store_true",
                        help="only each tiling's default launch setting")
    parser.add_argument("--no-split", action="store_true",
                        help="compile with split_mixed_loads=False (one load per tile)")
    args = parser.parse_args(argv)

    seen: list = []
    first_verified = dynamo._first_verified

    def keep(tiler, program, config, part, arch="cpu", *more):
        seen.append((tiler, program))
        return first_verified(tiler, program, config, part, arch, *more)

    dynamo._first_verified = keep
    for name, module, make in probe_tilings.modules(torch, args.rows):
        if name != args.module:
            continue
        module = module.to("cuda", torch.float16).eval()
        compiled = torch.compile(module, backend="mugraph", dynamic=False, options={
            "rest": "inductor", "cache_dir": args.cache_dir, "time_limit": 60})
        with torch.no_grad():
            compiled(*make())
    for tiler, program in seen:
        for tiling in tiler.tilings():
            if [g for _, g in tiling.axes] != args.grid:
                continue
            graph = tiling.graph
            index = next(i for i, op in enumerate(graph.ops) if op.kind is OpKind.CUSTOMIZED)
            block = graph.ops[index].attr("graph")
            base = default_launch(block)
            configs = [base] if args.default_only else [base, *launch_variants(block, base)]
            for config in configs:
                try:
                    prog = compile_graph(graph, cuda_graph=False, check=False,
                                         launch={index: config},
                                         split_mixed_loads=not args.no_split)
                    fails = 0
                    for seed in range(args.seeds):
                        try:
                            check_against_reference(graph, prog, seed=seed, scale=1.0)
                        except CodegenMismatchError:
                            fails += 1
                    inputs = random_inputs(program, "cuda", 7)
                    first = [o.clone() for o in prog(inputs=inputs)]
                    same = all(all(torch.equal(a, b) for a, b in zip(first, prog(inputs=inputs),
                                                                     strict=True))
                               for _ in range(5))
                    ms = cuda_mean_milliseconds(lambda p=prog, i=inputs: p(inputs=i))
                    print(f"{tiling.axes} loop {tiling.loop} {config.num_warps}w "
                          f"{config.num_stages}s: {fails}/{args.seeds} checks failed, "
                          f"repeats equal {same}, {ms:.4f} ms", flush=True)
                except Exception as error:  # noqa: BLE001 - a probe reports and goes on
                    print(f"{tiling.axes} loop {tiling.loop} {config}: "
                          f"{type(error).__name__}: {str(error)[:160]}", flush=True)


if __name__ == "__main__":
    main()
