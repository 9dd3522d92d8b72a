"""Experiments behind code-generation choices (GPU): which GEMV kernel shape reaches the
bandwidth floor, and which chained ``tl.dot`` launches Triton computes correctly.

    python -m benchmarks.probe_variants [--out DIR] [--parts gemv,chain]

``gemv``: X @ W for X of 1-16 rows, written three ways — ``dot`` (tl.dot over a K loop, one
kernel), ``fma`` (broadcast multiply and sum on CUDA cores, one kernel), ``splitk`` (tl.dot over
a K chunk into float32 partials, then a second kernel summing them: the μGraph split-K form) —
each over tile sizes, warps and stages; the fastest of each printed per shape.
``chain``: mugraph's one-kernel attention and hand-written LoRA μGraphs compiled with 2, 4 and
8 warps (the two-warp cap lifted for the experiment), compared with float64 references.
"""

from __future__ import annotations

import argparse
import functools
import itertools
import json
import sys
from pathlib import Path

import torch
import triton
import triton.language as tl

from mugraph.optimize import profile_callable

RESULTS: list[dict] = []
# the CUDA-core and two-kernel split-K families (first run: never faster than ``dot``)
FAMILIES_OLD = False


def log(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


@triton.jit
def _dot_kernel(x_ptr, w_ptr, o_ptr, M, N, K, MP: tl.constexpr, BK: tl.constexpr,
                BN: tl.constexpr, EVICT: tl.constexpr):
    pid = tl.program_id(0)
    rm = tl.arange(0, MP)
    rn = pid * BN + tl.arange(0, BN)
    rk = tl.arange(0, BK)
    acc = tl.zeros([MP, BN], dtype=tl.float32)
    for k0 in range(0, K, BK):
        x = tl.load(x_ptr + rm[:, None] * K + (k0 + rk)[None, :], mask=rm[:, None] < M, other=0.0)
        if EVICT:
            w = tl.load(w_ptr + (k0 + rk)[:, None] * N + rn[None, :], eviction_policy="evict_first")
        else:
            w = tl.load(w_ptr + (k0 + rk)[:, None] * N + rn[None, :])
        acc += tl.dot(x, w)
    tl.store(o_ptr + rm[:, None] * N + rn[None, :], acc.to(tl.float16), mask=rm[:, None] < M)


@triton.jit
def _swap_kernel(x_ptr, w_ptr, o_ptr, M, N, K, MP: tl.constexpr, BK: tl.constexpr,
                 BN: tl.constexpr):
    """out^T = W^T x^T: the weight tile is the dot's A operand (BN rows: wgmma-sized)."""
    pid = tl.program_id(0)
    rm = tl.arange(0, MP)
    rn = pid * BN + tl.arange(0, BN)
    rk = tl.arange(0, BK)
    acc = tl.zeros([BN, MP], dtype=tl.float32)
    for k0 in range(0, K, BK):
        x = tl.load(x_ptr + rm[:, None] * K + (k0 + rk)[None, :], mask=rm[:, None] < M, other=0.0)
        w = tl.load(w_ptr + (k0 + rk)[:, None] * N + rn[None, :])
        acc += tl.dot(tl.trans(w), tl.trans(x))
    tl.store(o_ptr + rm[None, :] * N + rn[:, None], acc.to(tl.float16), mask=rm[None, :] < M)


@triton.jit
def _desc_kernel(x_ptr, w_ptr, o_ptr, M, N, K, MP: tl.constexpr, BK: tl.constexpr,
                 BN: tl.constexpr):
    """The weight tile through a tensor descriptor (TMA on Hopper)."""
    pid = tl.program_id(0)
    w_desc = tl.make_tensor_descriptor(w_ptr, shape=[K, N], strides=[N, 1],
                                       block_shape=[BK, BN])
    rm = tl.arange(0, MP)
    rk = tl.arange(0, BK)
    rn = pid * BN + tl.arange(0, BN)
    acc = tl.zeros([MP, BN], dtype=tl.float32)
    for k0 in range(0, K, BK):
        x = tl.load(x_ptr + rm[:, None] * K + (k0 + rk)[None, :], mask=rm[:, None] < M, other=0.0)
        w = w_desc.load([k0, pid * BN])
        acc += tl.dot(x, w)
    tl.store(o_ptr + rm[:, None] * N + rn[None, :], acc.to(tl.float16), mask=rm[:, None] < M)


@triton.jit
def _fma_kernel(x_ptr, w_ptr, o_ptr, N, K, M: tl.constexpr, BK: tl.constexpr, BN: tl.constexpr):
    pid = tl.program_id(0)
    rn = pid * BN + tl.arange(0, BN)
    rk = tl.arange(0, BK)
    rm = tl.arange(0, M)
    acc = tl.zeros([M, BN], dtype=tl.float32)
    for k0 in range(0, K, BK):
        x = tl.load(x_ptr + rm[:, None] * K + (k0 + rk)[None, :]).to(tl.float32)
        w = tl.load(w_ptr + (k0 + rk)[:, None] * N + rn[None, :]).to(tl.float32)
        acc += tl.sum(x[:, :, None] * w[None, :, :], axis=1)
    tl.store(o_ptr + rm[:, None] * N + rn[None, :], acc.to(tl.float16))


@triton.jit
def _partial_kernel(x_ptr, w_ptr, p_ptr, M, N, K, KS, MP: tl.constexpr, BK: tl.constexpr,
                    BN: tl.constexpr):
    pid = tl.program_id(0)
    ps = tl.program_id(1)
    rm = tl.arange(0, MP)
    rn = pid * BN + tl.arange(0, BN)
    rk = tl.arange(0, BK)
    acc = tl.zeros([MP, BN], dtype=tl.float32)
    for k0 in range(ps * KS, ps * KS + KS, BK):
        x = tl.load(x_ptr + rm[:, None] * K + (k0 + rk)[None, :], mask=rm[:, None] < M, other=0.0)
        w = tl.load(w_ptr + (k0 + rk)[:, None] * N + rn[None, :])
        acc += tl.dot(x, w)
    tl.store(p_ptr + ps * M * N + rm[:, None] * N + rn[None, :], acc, mask=rm[:, None] < M)


@triton.jit
def _combine_kernel(p_ptr, o_ptr, MN, S: tl.constexpr, B: tl.constexpr):
    offs = tl.program_id(0) * B + tl.arange(0, B)
    acc = tl.zeros([B], dtype=tl.float32)
    for s in tl.static_range(S):
        acc += tl.load(p_ptr + s * MN + offs, mask=offs < MN, other=0.0)
    tl.store(o_ptr + offs, acc.to(tl.float16), mask=offs < MN)


def _time(fn, ref) -> tuple[float, float]:
    err = float((fn().float() - ref).norm() / ref.norm())
    return profile_callable(fn, warmup=5, reps=60).microseconds, err


def _launch_dot(x, w, out, bn, bk, wp, st, ev):
    m, k = x.shape
    n = w.shape[1]
    mp = max(16, triton.next_power_of_2(m))
    _dot_kernel[(n // bn,)](x, w, out, m, n, k, mp, bk, bn, ev, num_warps=wp, num_stages=st)
    return out


def _launch_swap(x, w, out, bn, bk, wp, st):
    m, k = x.shape
    n = w.shape[1]
    mp = max(16, triton.next_power_of_2(m))
    _swap_kernel[(n // bn,)](x, w, out, m, n, k, mp, bk, bn, num_warps=wp, num_stages=st)
    return out


def _launch_desc(x, w, out, bn, bk, wp, st):
    m, k = x.shape
    n = w.shape[1]
    mp = max(16, triton.next_power_of_2(m))
    _desc_kernel[(n // bn,)](x, w, out, m, n, k, mp, bk, bn, num_warps=wp, num_stages=st)
    return out


def _launch_fma(x, w, out, bn, bk, wp):
    m, k = x.shape
    n = w.shape[1]
    _fma_kernel[(n // bn,)](x, w, out, n, k, m, bk, bn, num_warps=wp, num_stages=3)
    return out


def _launch_splitk(x, w, part, out, bn, bk, sp, wp, st):
    m, k = x.shape
    n = w.shape[1]
    mp = max(16, triton.next_power_of_2(m))
    _partial_kernel[(n // bn, sp)](x, w, part, m, n, k, k // sp, mp, bk, bn, num_warps=wp,
                                   num_stages=st)
    _combine_kernel[(triton.cdiv(m * n, 1024),)](part, out, m * n, sp, 1024)
    return out


def _gemv_variants(m, k, n, x, w):
    """(family, params, callable) for every variant that fits the shape."""
    out = torch.empty(m, n, device="cuda", dtype=torch.float16)
    for bn, bk, wp, st in itertools.product((32, 64, 128), (128, 256), (4, 8), (3, 5)):
        if n % bn or k % bk or bn * bk * st > 128 * 256 * 4:
            continue
        if wp == 4:
            yield ("dot", dict(bn=bn, bk=bk, warps=wp, stages=st),
                   functools.partial(_launch_dot, x, w, out, bn, bk, wp, st, 0))
        yield ("swap", dict(bn=bn, bk=bk, warps=wp, stages=st),
               functools.partial(_launch_swap, x, w, out, bn, bk, wp, st))
        if wp == 4 and hasattr(tl, "make_tensor_descriptor"):
            yield ("desc", dict(bn=bn, bk=bk, warps=wp, stages=st),
                   functools.partial(_launch_desc, x, w, out, bn, bk, wp, st))
    if FAMILIES_OLD:
        for bn, bk, wp in itertools.product((64, 128), (32, 64), (4, 8)):
            if n % bn or k % bk:
                continue
            yield ("fma", dict(bn=bn, bk=bk, warps=wp),
                   functools.partial(_launch_fma, x, w, out, bn, bk, wp))
        for bn, bk, sp, wp, st in itertools.product((64, 128), (128,), (2, 4, 8), (4,), (3, 5)):
            if n % bn or k % (bk * sp):
                continue
            part = torch.empty(sp, m, n, device="cuda", dtype=torch.float32)
            yield ("splitk", dict(bn=bn, bk=bk, split=sp, warps=wp, stages=st),
                   functools.partial(_launch_splitk, x, w, part, out, bn, bk, sp, wp, st))


def gemv(shapes, bandwidth: float) -> None:
    for m, k, n in shapes:
        x = torch.randn(m, k, device="cuda", dtype=torch.float16)
        w = torch.randn(k, n, device="cuda", dtype=torch.float16) / 64
        ref = x.float() @ w.float()
        floor = (x.numel() + w.numel() + m * n) * 2 / bandwidth * 1e6
        best: dict[str, dict] = {}
        for family, params, fn in _gemv_variants(m, k, n, x, w):
            try:
                us, err = _time(fn, ref)
            except Exception as error:  # noqa: BLE001
                log(f"{family} {params}: {type(error).__name__}: {str(error)[:90]}")
                continue
            rec = {"part": "gemv", "shape": [m, k, n], "family": family, "params": params,
                   "us": us, "err": err, "floor_us": floor}
            RESULTS.append(rec)
            if family not in best or us < best[family]["us"]:
                best[family] = rec
        for family, rec in sorted(best.items()):
            print(f"gemv {m}x{k}x{n} {family:7s} {rec['us']:6.1f} us (floor {floor:.1f}) "
                  f"{rec['params']} err {rec['err']:.1e}")


def chain() -> None:
    import mugraph.runtime.compiled as compiled
    from mugraph import compile as mg_compile
    from mugraph.library import WORKLOADS
    from mugraph.semantics.reference import evaluate

    compiled.max_warps = lambda block: 16  # the experiment: no cap
    cases = []
    for rows in (32, 64, 128):
        for n_tile in (32, 64):
            s = {"h": 1, "h_kv": 1, "s": 128, "d": 64, "n": 512, "h_tile": 1,
                 "s_parts": 128 // rows, "d_parts": 1, "n_tile": n_tile}
            cases.append((f"flash rows={rows} n_tile={n_tile}",
                          WORKLOADS["attention_flash"].optimized(s)))
    for m, r in ((64, 16), (64, 32), (32, 16)):
        s = {"m": m, "k": 256, "n": 1024, "r": r, "k_tile": 256, "n_tile": 64}
        cases.append((f"lora m={m} r={r} (no loop)", WORKLOADS["lora"].optimized(s)))
        s = {"m": m, "k": 1024, "n": 1024, "r": r, "k_tile": 256, "n_tile": 64}
        cases.append((f"lora m={m} r={r} (loop)", WORKLOADS["lora"].optimized(s)))
    gen = torch.Generator().manual_seed(0)
    for label, graph in cases:
        inputs = [(torch.rand(t.dims, generator=gen) - 0.5) for t in graph.input_types]
        ref = torch.from_numpy(evaluate(graph, [t.double().numpy() for t in inputs])[0])
        cuda_in = [t.to("cuda", torch.float16) for t in inputs]
        cells = []
        for warps in (2, 4, 8):
            try:
                prog = mg_compile(graph, check=False, num_warps=warps, num_stages=3)
                out = prog(inputs=cuda_in)[0].double().cpu()
                err = float((out - ref).norm() / ref.norm())
                torch.cuda.synchronize()
            except Exception as error:  # noqa: BLE001
                err = float("nan")
                log(f"{label} warps={warps}: {type(error).__name__}: {str(error)[:90]}")
                if "illegal" in str(error):
                    print(f"chain {label}: FAULT at {warps} warps; stopping the chain part")
                    return
            cells.append(f"{warps}w {err:.1e}")
            RESULTS.append({"part": "chain", "case": label, "warps": warps, "err": err})
        print(f"chain {label:32s} " + "  ".join(cells))


def rms_sources() -> None:
    """mugraph's RMSNorm+Linear kernel as generated, and hand edits of its source: where do
    the microseconds beyond the plain GEMV go?"""
    from mugraph.codegen.loader import load_kernel
    from mugraph.codegen.triton_gen import generate_kernel
    from mugraph.library import WORKLOADS

    for n_tile, k_tile in ((64, 128), (32, 128)):
        graph = WORKLOADS["rmsnorm_linear"].optimized(
            {"m": 2, "k": 4096, "n": 6144, "n_tile": n_tile, "k_tile": k_tile})
        block = next(op.attr("graph") for op in graph.ops if op.kind.value == "customized")
        src = generate_kernel(block, "k").source
        load_x = next(line for line in src.splitlines() if line.strip().startswith("b0 = "))
        edits = {
            "as generated": src,
            "x loaded twice": src.replace("b0f = b0.to(tl.float32)",
                                          load_x.strip().replace("b0 = ", "b0f = ")
                                          + ".to(tl.float32)"),
            "no rms": src.replace("acc4 += tl.expand_dims(tl.sum(b0f * b0f, axis=1), 1)",
                                  "pass"),
        }
        x = torch.rand(2, 4096, device="cuda", dtype=torch.float16) - 0.5
        w = (torch.rand(4096, 6144, device="cuda", dtype=torch.float16) - 0.5) / 16
        ref = (x.float() / x.float().pow(2).mean(-1, keepdim=True).sqrt()) @ w.float()
        out = torch.empty(2, 6144, device="cuda", dtype=torch.float16)
        for label, text in edits.items():
            kernel = load_kernel("k", text)
            for warps, stages in ((4, 4), (4, 6), (8, 4)):
                fn = functools.partial(_launch_generated, kernel, block.grid_dim, x, w, out,
                                       warps, stages)
                try:
                    us, err = _time(fn, ref)
                except Exception as error:  # noqa: BLE001
                    log(f"rms {label}: {type(error).__name__}: {str(error)[:90]}")
                    continue
                RESULTS.append({"part": "rms", "label": label, "n_tile": n_tile,
                                "warps": warps, "stages": stages, "us": us, "err": err})
                print(f"rms n_tile={n_tile} {label:15s} {warps}w{stages}s {us:6.1f} us "
                      f"err {err:.1e}")


def _launch_generated(kernel, grid, x, w, out, warps, stages):
    kernel[grid](x, *x.stride(), w, *w.stride(), out, *out.stride(), num_warps=warps,
                 num_stages=stages)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=".")
    parser.add_argument("--parts", default="gemv")
    args = parser.parse_args()
    src = torch.empty(256 * 1024**2 // 2, device="cuda", dtype=torch.float16)
    dst = torch.empty_like(src)
    seconds = profile_callable(functools.partial(dst.copy_, src), warmup=3, reps=20,
                               flush_l2=False).seconds
    bandwidth = 2 * src.numel() * 2 / seconds
    del src, dst
    print(f"copy bandwidth {bandwidth / 1e12:.2f} TB/s; triton {triton.__version__}")
    if hasattr(triton, "set_allocator"):  # scratch for device-side tensor descriptors
        triton.set_allocator(lambda size, align, stream: torch.empty(size, dtype=torch.int8,
                                                                     device="cuda"))
    parts = args.parts.split(",")
    try:
        if "rms" in parts:
            rms_sources()
        if "gemv" in parts:
            gemv([(2, 4096, 6144), (8, 4096, 4096), (1, 4096, 14336)], bandwidth)
        if "chain" in parts:
            chain()
    finally:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        (Path(args.out) / "variants.json").write_text(json.dumps(RESULTS, indent=1))


if __name__ == "__main__":
    main()
