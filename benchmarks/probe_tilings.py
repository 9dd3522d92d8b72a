"""Every tiling of a class answer timed on the GPU, for a model's projections (a probe).

    python benchmarks/probe_tilings.py --cache-dir DIR [--tiles 64 128 32 16 256 512]
    python benchmarks/probe_tilings.py --cache-dir DIR --rows 512 --tune 3   # prefill sizes

Compiles small modules at Llama-3.2-1B sizes (batch 1, ``--rows`` tokens, float16) with
``backend="mugraph"``: the MLP's down projection plus residual (K = 8192), the attention's
output projection plus residual (K = 2048), RMSNorm + QKV projection and RMSNorm + the gated
MLP's gate and up projections (``silu(gate) * up``). Each module's eager and Inductor times
(same timer) come first. For each partition
the class path tiles, it lists every tiling the tiler builds with ``--tiles`` as the tile
sizes of both the grid and the for-loop (``shape_class.GRID_TILES`` / ``LOOP_TILES``), the
cost model's estimate and the time of one call on the GPU (ms, mean of 20 back-to-back calls
after 3), fastest first, and the tiling the backend chose with its own tiles. In the output, a
grid entry is (index, parts) and the loop (index, iterations). ``--launches 8,3 4,4``
times each listed tiling again with those launch settings (after checking its outputs against
the default's). ``--tune K`` then tunes the K fastest tilings' launch settings
(:func:`mugraph.optimize.tune.optimize_program`) and times the tuned programs with the same
timer.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def modules(torch, rows: int = 1):
    from torch import nn

    class LinearResidual(nn.Module):
        def __init__(self, k: int, n: int) -> None:
            super().__init__()
            self.proj = nn.Linear(k, n, bias=False)

        def forward(self, x, r):
            return self.proj(x) + r

    class NormLinear(nn.Module):
        def __init__(self, k: int, n: int) -> None:
            super().__init__()
            self.weight = nn.Parameter(torch.ones(k))
            self.proj = nn.Linear(k, n, bias=False)

        def forward(self, x):
            xf = x.float()
            xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-5)
            return self.proj(self.weight * xf.to(x.dtype))

    class NormGatedMLP(nn.Module):
        def __init__(self, k: int, n: int) -> None:
            super().__init__()
            self.weight = nn.Parameter(torch.ones(k))
            self.gate = nn.Linear(k, n, bias=False)
            self.up = nn.Linear(k, n, bias=False)

        def forward(self, x):
            xf = x.float()
            xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-5)
            h = self.weight * xf.to(x.dtype)
            return nn.functional.silu(self.gate(h)) * self.up(h)

    def act(k):
        return torch.randn(1, rows, k, device="cuda", dtype=torch.float16)

    return [
        ("down + residual", LinearResidual(8192, 2048), lambda: (act(8192), act(2048))),
        ("o_proj + residual", LinearResidual(2048, 2048), lambda: (act(2048), act(2048))),
        ("norm + qkv", NormLinear(2048, 3072), lambda: (act(2048),)),
        ("norm + gate/up", NormGatedMLP(2048, 8192), lambda: (act(2048),)),
    ]


def main(argv=None) -> None:
    import torch

    import mugraph.integration  # noqa: F401 - registers the backend
    from mugraph.integration import dynamo
    from mugraph.integration.runtime import cuda_mean_milliseconds
    from mugraph.search import shape_class as sc

    parser = argparse.ArgumentParser()
    parser.add_argument("--cache-dir", default=None)
    parser.add_argument("--tiles", type=int, nargs="+", default=[64, 128, 32, 16, 256, 512])
    parser.add_argument("--top", type=int, default=12)
    parser.add_argument("--rows", type=int, default=1, help="tokens per call")
    parser.add_argument("--tune", type=int, default=0, help="tune this many fastest tilings")
    parser.add_argument("--max", type=int, default=96, help="time the cheapest this many")
    parser.add_argument("--only", nargs="*", default=None, help="module names to probe")
    parser.add_argument("--launches", nargs="*", default=[], metavar="WARPS,STAGES",
                        help="also time every listed tiling with these launch settings")
    args = parser.parse_args(argv)

    seen: list = []
    first_verified = dynamo._first_verified

    def keep(tiler, program, config, part, arch="cpu", *more):
        best = first_verified(tiler, program, config, part, arch, *more)
        seen.append((tiler, program, dict(part.tiling)))
        return best

    dynamo._first_verified = keep
    from mugraph.search.driver import default_cost

    for name, module, make in modules(torch, args.rows):
        if args.only and not any(o in name for o in args.only):
            continue
        module = module.to("cuda", torch.float16).eval()
        inputs = make()
        with torch.no_grad():
            torch._dynamo.reset()
            eager_ms = cuda_mean_milliseconds(lambda m=module, i=inputs: m(*i))
            inductor = torch.compile(module, dynamic=False)
            inductor(*inputs)
            inductor_ms = cuda_mean_milliseconds(lambda f=inductor, i=inputs: f(*i))
        print(f"\n{name}, {args.rows} rows: eager {eager_ms:.4f} ms, "
              f"inductor {inductor_ms:.4f} ms")
        torch._dynamo.reset()
        dynamo._TILED.clear()
        seen.clear()
        compiled = torch.compile(module, backend="mugraph", dynamic=False, options={
            "rest": "inductor", "cache_dir": args.cache_dir, "time_limit": 60})
        with torch.no_grad():
            compiled(*make())
        for tiler, program, chosen in seen:
            kept = sc.GRID_TILES, sc.LOOP_TILES
            sc.GRID_TILES = sc.LOOP_TILES = tuple(args.tiles)
            try:
                tilings = tiler.tilings()[: args.max]
            finally:
                sc.GRID_TILES, sc.LOOP_TILES = kept
            timer = dynamo._tiling_timer(program)
            timer.precompile([t.graph for t in tilings])  # in parallel, then timed one by one
            rows = sorted(((timer(t.graph), default_cost(t.graph) * 1e6, t) for t in tilings),
                          key=lambda r: r[0])
            print(f"\n{name}: {len(tilings)} tilings; the backend chose {chosen}")
            print(f"{'ms':>8} {'est us':>8}  grid / loop")
            for ms, est, t in rows[: args.top]:
                print(f"{ms:8.4f} {est:8.1f}  {list(t.axes)} / {t.loop}", flush=True)
                if args.launches:
                    print("           " + _with_launches(timer, t.graph, args.launches),
                          flush=True)
            for ms, _, t in rows[: args.tune]:
                if ms == float("inf"):
                    continue
                tuned = _tuned(t.graph, program)
                print(f"tuned {list(t.axes)} / {t.loop}: {ms:.4f} -> {tuned}", flush=True)


def _with_launches(timer, graph, launches: list[str]) -> str:
    """``graph``'s time (ms) with each launch setting of ``launches`` ("warps,stages"), or why
    it is not timed (it fails to build or run, or its outputs disagree with the default
    setting's)."""
    from mugraph.ir.ops import OpKind
    from mugraph.optimize.precompile import precompile
    from mugraph.optimize.tune import disagreement
    from mugraph.runtime.compiled import LaunchConfig

    kernels = [i for i, op in enumerate(graph.ops) if op.kind is OpKind.CUSTOMIZED]
    if len(kernels) != 1:
        return "(not one kernel)"
    reference = [o.clone() for o in timer._run(timer._compiled(graph))]
    compiled: dict[str, object] = {}
    for text in launches:
        warps, stages = (int(v) for v in text.split(","))
        try:
            compiled[text] = timer._compiled(graph, {kernels[0]: LaunchConfig(warps, stages)})
        except Exception as error:  # noqa: BLE001 - a probe reports and goes on
            compiled[text] = type(error).__name__
    precompile([c for c in compiled.values() if not isinstance(c, str)])  # in parallel
    cells = []
    for text, program in compiled.items():
        cell = program
        if not isinstance(program, str):
            try:
                wrong = disagreement(timer._run(program), reference)
                cell = "wrong" if wrong is not None else f"{timer._time(program):.4f}"
            except Exception as error:  # noqa: BLE001 - a probe reports and goes on
                cell = type(error).__name__
        cells.append(f"{text.replace(',', 'w')}s {cell}")
    return ", ".join(cells)


def _tuned(graph, program) -> str:
    """The tuned launch settings of ``graph`` and its time by the probe's timer."""
    import time

    from mugraph.codegen.check import random_inputs
    from mugraph.integration.runtime import cuda_mean_milliseconds
    from mugraph.optimize.tune import optimize_program

    try:
        result = optimize_program(graph, check=False, deadline=time.perf_counter() + 60)
        inputs = random_inputs(program, "cuda")
        ms = cuda_mean_milliseconds(lambda: result.program(inputs=inputs))
        return f"{ms:.4f} ms with {result.variants}"
    except Exception as error:  # noqa: BLE001 - a probe reports and goes on
        return f"failed: {type(error).__name__}: {error}"


if __name__ == "__main__":
    main()
