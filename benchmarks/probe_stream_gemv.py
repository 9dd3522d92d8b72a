"""How fast can a persistent program stream a projection's weights? (GPU)

    python benchmarks/probe_stream_gemv.py [--rows 16384] [--cols 2048]

The persistent kernel's largest levels are matrix-vector products whose weights are read once
(Llama-3.2-1B's gate/up: 16384 x 2048 bfloat16, 67 MB, in blocks of 4 rows). This probe
streams such a matrix the way a task body does, without the rest of the kernel: P programs
(two per SM) each take a contiguous range of blocks, load each block's tile into registers a
few blocks ahead (``depth``), optionally prefetch into L2 further ahead, and reduce it against
a resident row. Its GB/s (weight bytes read per second, L2 flushed before every launch) is
what a level of that size can reach in steady state, against cuBLAS's product of the same
shape and a device-to-device copy (bytes read + written). The table is printed last.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
import triton
import triton.language as tl

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from mugraph.optimize.profile import profile_callable  # noqa: E402


@triton.jit
def _tile(w, blk, nblk, K: tl.constexpr, ROWS: tl.constexpr):
    rows = blk * ROWS + tl.arange(0, ROWS)[:, None]
    cols = tl.arange(0, K)[None, :]
    return tl.load(w + rows * K + cols, mask=(tl.full([1, 1], blk, tl.int32) < nblk),
                   other=0.0, eviction_policy="evict_first")


@triton.jit
def _prefetch(w, blk, nblk, K: tl.constexpr, ROWS: tl.constexpr):
    rows = blk * ROWS + tl.arange(0, ROWS)[:, None]
    lines = tl.arange(0, K // 64)[None, :] * 64  # one address per 128-byte line
    ptr = w + tl.where((tl.full([1, 1], blk, tl.int32) < nblk), rows * K + lines, 0)
    tl.inline_asm_elementwise("prefetch.global.L2::evict_normal [$1];", "=r,l", [ptr],
                              dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def stream(w, x, out, nblk, per, K: tl.constexpr, ROWS: tl.constexpr, DEPTH: tl.constexpr,
           AHEAD: tl.constexpr):
    """Program p reduces blocks [p * per, (p + 1) * per): the tile of block b is loaded into
    registers DEPTH blocks ahead, and (AHEAD > 0) prefetched into L2 DEPTH + AHEAD ahead."""
    pid = tl.program_id(0)
    first = pid * per
    end = tl.minimum(first + per, nblk)
    xv = tl.load(x + tl.arange(0, K))[None, :].to(tl.float32)
    t0 = _tile(w, first, end, K, ROWS)
    if DEPTH >= 2:
        t1 = _tile(w, first + 1, end, K, ROWS)
    if DEPTH >= 3:
        t2 = _tile(w, first + 2, end, K, ROWS)
    for blk in range(first, end):
        cur = t0
        if DEPTH == 1:
            t0 = _tile(w, blk + 1, end, K, ROWS)
        elif DEPTH == 2:
            t0 = t1
            t1 = _tile(w, blk + 2, end, K, ROWS)
        else:
            t0 = t1
            t1 = t2
            t2 = _tile(w, blk + 3, end, K, ROWS)
        if AHEAD > 0:
            _prefetch(w, blk + DEPTH + AHEAD, end, K, ROWS)
        acc = tl.sum(cur.to(tl.float32) * xv, axis=1)
        tl.store(out + blk * ROWS + tl.arange(0, ROWS), acc)


def timed(fn) -> float:
    """Median microseconds of ``fn`` with L2 flushed before each call (the suite's timing)."""
    return profile_callable(fn, warmup=2, reps=20).microseconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=16384)
    parser.add_argument("--cols", type=int, default=2048)
    args = parser.parse_args()
    n, k = args.rows, args.cols
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    w = torch.randn((n, k), device="cuda", dtype=torch.bfloat16)
    x = torch.randn(k, device="cuda", dtype=torch.bfloat16)
    out = torch.empty(n, device="cuda", dtype=torch.float32)
    want = (w.float() @ x.float())
    nbytes = w.numel() * w.element_size()
    rows = []

    def row(name: str, us: float, moved: int = nbytes) -> None:
        rows.append((name, us, moved / us / 1e3))
        print(f"{name}: {us:.2f} µs, {moved / us / 1e3:.0f} GB/s", flush=True)

    row("cuBLAS x @ W.T", timed(lambda: torch.matmul(w, x)))
    dst = torch.empty_like(w)
    row("copy (read + write)", timed(lambda: dst.copy_(w)), 2 * nbytes)
    for per_sm, warps in ((2, 4), (1, 8), (3, 4)):
        programs = per_sm * sms
        for tile_rows in (4, 8):
            nblk = n // tile_rows
            per = triton.cdiv(nblk, programs)
            for depth in (1, 2, 3):
                for ahead in (0, 1, 3):
                    def launch(d=depth, a=ahead, r=tile_rows, nb=nblk, pp=per, g=programs,
                               nw=warps):
                        stream[(g,)](w, x, out, nb, pp, k, r, d, a, num_warps=nw,
                                     num_stages=1)
                    launch()
                    torch.cuda.synchronize()
                    err = float((out - want).abs().max() / want.abs().max())
                    if err > 1e-2:
                        print(f"wrong result ({err:.3g}) at {per_sm}/SM rows {tile_rows} "
                              f"depth {depth} ahead {ahead}")
                        continue
                    kb = tile_rows * k * 2 // 1024
                    row(f"{per_sm}/SM x {warps} warps, {tile_rows} rows ({kb} KB), depth "
                        f"{depth}, L2 ahead {ahead}", timed(launch))
    print("\n| stream | µs | GB/s |\n| --- | --- | --- |")
    for name, us, rate in rows:
        print(f"| {name} | {us:.2f} | {rate:.0f} |")


if __name__ == "__main__":
    main()
