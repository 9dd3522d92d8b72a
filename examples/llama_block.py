"""A LLaMA-style decoder block through ``torch.compile(..., backend="mugraph")``.

The block is plain PyTorch: RMSNorm (with its epsilon), grouped-query attention with a causal
softmax, and a gated MLP with SiLU. mugraph captures what it can express exactly, searches a
μGraph for each captured partition (or takes it from the result cache), and leaves the rest to
PyTorch. The script prints which subgraphs mugraph took, which nodes fell back and why, and
checks the output against eager PyTorch.

    python examples/llama_block.py                      # small, on the CPU (reference semantics)
    python examples/llama_block.py --device cuda        # larger, float16, on the GPU
    python examples/llama_block.py --time-limit 20 --cache-dir /tmp/mugraph-cache

A second run finds every search result in the cache.
"""

from __future__ import annotations

import argparse
import math
import time
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

import mugraph.integration as mgi


@dataclass(frozen=True)
class BlockConfig:
    dim: int = 64
    n_heads: int = 4
    n_kv_heads: int = 2
    hidden: int = 128
    eps: float = 1e-5
    batch: int = 1
    seq: int = 8


SIZES = {
    "cpu": BlockConfig(),
    "cuda": BlockConfig(dim=2048, n_heads=16, n_kv_heads=4, hidden=5632, batch=1, seq=128),
}
TOLERANCE = {torch.float32: 1e-4, torch.float16: 2e-2, torch.bfloat16: 5e-2}


class Attention(nn.Module):
    """Grouped-query attention; the key/value heads broadcast over each group of query heads."""

    def __init__(self, cfg: BlockConfig) -> None:
        super().__init__()
        self.n_kv, self.group = cfg.n_kv_heads, cfg.n_heads // cfg.n_kv_heads
        self.head_dim = cfg.dim // cfg.n_heads
        self.scale = 1.0 / math.sqrt(self.head_dim)
        self.wq = nn.Linear(cfg.dim, cfg.dim, bias=False)
        self.wk = nn.Linear(cfg.dim, self.n_kv * self.head_dim, bias=False)
        self.wv = nn.Linear(cfg.dim, self.n_kv * self.head_dim, bias=False)
        self.wo = nn.Linear(cfg.dim, cfg.dim, bias=False)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        q = self.wq(x).view(b, s, self.n_kv, self.group, self.head_dim).permute(0, 2, 3, 1, 4)
        k = self.wk(x).view(b, s, self.n_kv, 1, self.head_dim).permute(0, 2, 3, 4, 1)
        v = self.wv(x).view(b, s, self.n_kv, 1, self.head_dim).permute(0, 2, 3, 1, 4)
        scores = (q @ k) * self.scale + mask  # [b, kv, group, s, s]
        out = torch.softmax(scores, dim=-1) @ v  # [b, kv, group, s, head_dim]
        return self.wo(out.permute(0, 3, 1, 2, 4).reshape(b, s, -1))


class FeedForward(nn.Module):
    """The gated MLP: w2(silu(w1 x) * w3 x)."""

    def __init__(self, cfg: BlockConfig) -> None:
        super().__init__()
        self.w1 = nn.Linear(cfg.dim, cfg.hidden, bias=False)
        self.w3 = nn.Linear(cfg.dim, cfg.hidden, bias=False)
        self.w2 = nn.Linear(cfg.hidden, cfg.dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class DecoderBlock(nn.Module):
    """Pre-norm residual block: x + attn(norm(x)), then + mlp(norm(.))."""

    def __init__(self, cfg: BlockConfig) -> None:
        super().__init__()
        self.attention_norm = nn.RMSNorm(cfg.dim, eps=cfg.eps)
        self.attention = Attention(cfg)
        self.ffn_norm = nn.RMSNorm(cfg.dim, eps=cfg.eps)
        self.feed_forward = FeedForward(cfg)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        h = x + self.attention(self.attention_norm(x), mask)
        return h + self.feed_forward(self.ffn_norm(h))


def causal_mask(seq: int, dtype: torch.dtype, device: str) -> torch.Tensor:
    """An additive mask: 0 on and below the diagonal, -inf above it."""
    return torch.full((seq, seq), float("-inf"), dtype=dtype, device=device).triu(1)


def make_inputs(cfg: BlockConfig, dtype: torch.dtype, device: str, seed: int = 0):
    torch.manual_seed(seed)
    block = DecoderBlock(cfg).to(device=device, dtype=dtype).eval()
    x = torch.randn(cfg.batch, cfg.seq, cfg.dim, dtype=dtype, device=device)
    return block, x, causal_mask(cfg.seq, dtype, device)


def compile_block(block: nn.Module, time_limit: float, cache_dir: str | None, **extra):
    options = {"time_limit": time_limit, "cache_dir": cache_dir, **extra}
    return torch.compile(block, backend="mugraph", options=options, dynamic=False)


def relative_error(got: torch.Tensor, want: torch.Tensor) -> float:
    scale = want.float().abs().max().clamp_min(1e-30)
    return float((got.float() - want.float()).abs().max() / scale)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--dtype", default=None, choices=["float32", "float16", "bfloat16"])
    parser.add_argument("--time-limit", type=float, default=None, help="seconds per partition")
    parser.add_argument("--cache-dir", default=None)
    parser.add_argument("--run-unimproved", action="store_true",
                        help="run captured partitions on mugraph even when no better μGraph")
    args = parser.parse_args(argv)
    cfg = SIZES[args.device]
    dtype = getattr(torch, args.dtype or ("float32" if args.device == "cpu" else "float16"))
    time_limit = args.time_limit
    if time_limit is None:
        time_limit = 4.0 if args.device == "cpu" else 30.0

    block, x, mask = make_inputs(cfg, dtype, args.device)
    mgi.clear_reports()
    compiled = compile_block(block, time_limit, args.cache_dir, run_unimproved=args.run_unimproved)
    with torch.no_grad():
        started = time.perf_counter()
        got = compiled(x, mask)
        compile_s = time.perf_counter() - started
        want = block(x, mask)
    for report in mgi.reports():
        print(report.format())
    taken = [p for r in mgi.reports() for p in r.taken]
    hits = sum(p.cache == "hit" for r in mgi.reports() for p in r.partitions)
    parts = sum(len(r.partitions) for r in mgi.reports())
    print(f"\nmugraph runs {len(taken)} of {parts} partitions; {hits} cache hits; "
          f"first call (compile + search + run) {compile_s:.1f} s")
    err = relative_error(got, want)
    ok = err <= TOLERANCE[dtype]
    print(f"output vs eager: max relative error {err:.2e} ({'OK' if ok else 'MISMATCH'}, "
          f"tolerance {TOLERANCE[dtype]:.0e} for {str(dtype).removeprefix('torch.')})")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
