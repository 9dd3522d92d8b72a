"""A LLaMA-style decoder block through ``torch.compile(..., backend="mugraph")``.

The block is plain PyTorch, written as models write it: RMSNorm in float32 with its epsilon
(``x * rsqrt(mean(x²) + eps) * weight``), grouped-query attention through
``scaled_dot_product_attention(is_causal=True, enable_gqa=True)``, and a gated MLP with SiLU.
mugraph canonicalizes those idioms, partitions the block around its matmuls and attention,
searches each partition's shape class on a small representative (or takes it from the result
cache), tiles the answer for the real sizes and leaves the rest to PyTorch. The script prints
the partitions, whether mugraph runs the ones that matter (RMSNorm + Q/K/V projection,
attention, RMSNorm + gated MLP), and checks the output against eager PyTorch.

    python examples/llama_block.py                      # small, on the CPU (reference semantics)
    python examples/llama_block.py --device cuda        # larger, float16, on the GPU
    python examples/llama_block.py --time-limit 20 --cache-dir /tmp/mugraph-cache

A second run finds every search result in the cache.
"""

from __future__ import annotations

import argparse
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
    seq: int = 32


SIZES = {
    "cpu": BlockConfig(),
    "cuda": BlockConfig(dim=2048, n_heads=16, n_kv_heads=4, hidden=5632, batch=1, seq=128),
}
TOLERANCE = {torch.float32: 1e-4, torch.float16: 2e-2, torch.bfloat16: 5e-2}


class RMSNorm(nn.Module):
    """RMSNorm as model code writes it: in float32, back to the input dtype, times a weight."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x.to(torch.float32)
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * h.to(x.dtype)


class Attention(nn.Module):
    """Grouped-query causal attention through scaled_dot_product_attention."""

    def __init__(self, cfg: BlockConfig) -> None:
        super().__init__()
        self.n_heads, self.n_kv = cfg.n_heads, cfg.n_kv_heads
        self.head_dim = cfg.dim // cfg.n_heads
        self.wq = nn.Linear(cfg.dim, cfg.dim, bias=False)
        self.wk = nn.Linear(cfg.dim, self.n_kv * self.head_dim, bias=False)
        self.wv = nn.Linear(cfg.dim, self.n_kv * self.head_dim, bias=False)
        self.wo = nn.Linear(cfg.dim, cfg.dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        q = self.wq(x).view(b, s, self.n_heads, self.head_dim).transpose(1, 2)
        k = self.wk(x).view(b, s, self.n_kv, self.head_dim).transpose(1, 2)
        v = self.wv(x).view(b, s, self.n_kv, self.head_dim).transpose(1, 2)
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        return self.wo(out.transpose(1, 2).reshape(b, s, -1))


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
        self.attention_norm = RMSNorm(cfg.dim, eps=cfg.eps)
        self.attention = Attention(cfg)
        self.ffn_norm = RMSNorm(cfg.dim, eps=cfg.eps)
        self.feed_forward = FeedForward(cfg)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x + self.attention(self.attention_norm(x))
        return h + self.feed_forward(self.ffn_norm(h))


def make_inputs(cfg: BlockConfig, dtype: torch.dtype, device: str, seed: int = 0):
    torch.manual_seed(seed)
    block = DecoderBlock(cfg).to(device=device, dtype=dtype).eval()
    with torch.no_grad():
        for norm in (block.attention_norm, block.ffn_norm):
            norm.weight.uniform_(0.5, 1.5)
    x = torch.randn(cfg.batch, cfg.seq, cfg.dim, dtype=dtype, device=device)
    return block, x


# the partitions that matter: (shape class, what it is)
THAT_MATTER = (("norm_linear", "RMSNorm + Q/K/V projection"), ("attention", "attention"),
               ("gated_mlp", "RMSNorm + gated MLP"))


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
        time_limit = 30.0

    block, x = make_inputs(cfg, dtype, args.device)
    mgi.clear_reports()
    compiled = compile_block(block, time_limit, args.cache_dir, run_unimproved=args.run_unimproved)
    with torch.no_grad():
        started = time.perf_counter()
        got = compiled(x)
        compile_s = time.perf_counter() - started
        want = block(x)
    for report in mgi.reports():
        print(report.format())
    taken = [p for r in mgi.reports() for p in r.taken]
    hits = sum(p.cache == "hit" for r in mgi.reports() for p in r.partitions)
    parts = sum(len(r.partitions) for r in mgi.reports())
    print(f"\nmugraph runs {len(taken)} of {parts} partitions; {hits} cache hits; "
          f"first call (compile + search + run) {compile_s:.1f} s")
    classes = {p.shape_class for p in taken}
    for name, what in THAT_MATTER:
        print(f"  {what:28s} {'runs on mugraph' if name in classes else 'NOT on mugraph'}")
    err = relative_error(got, want)
    ok = err <= TOLERANCE[dtype]
    print(f"output vs eager: max relative error {err:.2e} ({'OK' if ok else 'MISMATCH'}, "
          f"tolerance {TOLERANCE[dtype]:.0e} for {str(dtype).removeprefix('torch.')})")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
