"""Every tiling of a class answer timed on the GPU, for a model's decode projections (a probe).

    python benchmarks/probe_tilings.py --cache-dir DIR [--tiles 64 128 32 16 256 512]

Compiles three small modules at Llama-3.2-1B decode sizes (batch 1, one token, float16) with
``backend="mugraph"``: the MLP's down projection plus residual (K = 8192), the attention's
output projection plus residual (K = 2048) and RMSNorm + QKV projection. For each partition
the class path tiles, it lists every tiling the tiler builds with ``--tiles`` as the tile
sizes of both the grid and the for-loop (``shape_class.GRID_TILES`` / ``LOOP_TILES``), the
cost model's estimate and the time of one call on the GPU (ms, mean of 20 back-to-back calls
after 3), fastest first, and the tiling the backend chose with its own tiles. In the output, a
grid entry is (index, parts) and the loop (index, iterations).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def modules(torch):
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

    def act(k):
        return torch.randn(1, 1, k, device="cuda", dtype=torch.float16)

    return [
        ("down + residual", LinearResidual(8192, 2048), lambda: (act(8192), act(2048))),
        ("o_proj + residual", LinearResidual(2048, 2048), lambda: (act(2048), act(2048))),
        ("norm + qkv", NormLinear(2048, 3072), lambda: (act(2048),)),
    ]


def main(argv=None) -> None:
    import torch

    import mugraph.integration  # noqa: F401 - registers the backend
    from mugraph.integration import dynamo
    from mugraph.search import shape_class as sc

    parser = argparse.ArgumentParser()
    parser.add_argument("--cache-dir", default=None)
    parser.add_argument("--tiles", type=int, nargs="+", default=[64, 128, 32, 16, 256, 512])
    parser.add_argument("--top", type=int, default=12)
    args = parser.parse_args(argv)

    seen: list = []
    first_verified = dynamo._first_verified

    def keep(tiler, program, config, part, arch="cpu"):
        best = first_verified(tiler, program, config, part, arch)
        seen.append((tiler, program, dict(part.tiling)))
        return best

    dynamo._first_verified = keep
    from mugraph.search.driver import default_cost

    for name, module, make in modules(torch):
        module = module.to("cuda", torch.float16).eval()
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
                tilings = tiler.tilings()
            finally:
                sc.GRID_TILES, sc.LOOP_TILES = kept
            timer = dynamo._tiling_timer(program)
            rows = sorted(((timer(t.graph), default_cost(t.graph) * 1e6, t) for t in tilings),
                          key=lambda r: r[0])
            print(f"\n{name}: {len(tilings)} tilings; the backend chose {chosen}")
            print(f"{'ms':>8} {'est us':>8}  grid / loop")
            for ms, est, t in rows[: args.top]:
                print(f"{ms:8.4f} {est:8.1f}  {list(t.axes)} / {t.loop}", flush=True)


if __name__ == "__main__":
    main()
