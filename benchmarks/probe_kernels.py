"""Where mugraph's generated kernels stand against what Triton can do on the same shapes (GPU).

    python benchmarks/probe_kernels.py [--quick] [--out DIR]

Three parts, each printed as a table, every time the median of CUDA-event times with the L2
cache flushed (``mugraph.optimize.profile_callable``), every output compared with PyTorch:

1. ``gemv``: a plain Triton kernel of ``X @ W`` (X of 1-16 rows), written here as a yardstick,
   over tile sizes, K splits, warps and pipeline stages: the bandwidth Triton reaches.
2. ``mugraph-gemv``: mugraph's kernels for the library's RMSNorm+Linear and gated-MLP μGraphs
   at suite sizes, over tile sizes and launch settings.
3. ``attention``: the library's attention μGraphs (the runner's candidates) for a few rows,
   beside SDPA.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch
import triton
import triton.language as tl

from mugraph.optimize import profile_callable

RESULTS: list[dict] = []


def log(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


@triton.jit
def _gemv_kernel(x_ptr, w_ptr, o_ptr, M, N, K_PER: tl.constexpr, MP: tl.constexpr,
                 BK: tl.constexpr, BN: tl.constexpr, SPLIT: tl.constexpr):
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    rm = tl.arange(0, MP)
    rn = pid_n * BN + tl.arange(0, BN)
    rk = tl.arange(0, BK)
    acc = tl.zeros([MP, BN], dtype=tl.float32)
    k0 = pid_k * K_PER
    for kk in range(0, K_PER, BK):
        k = k0 + kk + rk
        x = tl.load(x_ptr + rm[:, None] * (K_PER * SPLIT) + k[None, :], mask=rm[:, None] < M,
                    other=0.0)
        w = tl.load(w_ptr + k[:, None] * N + rn[None, :])
        acc += tl.dot(x, w)
    if SPLIT == 1:
        tl.store(o_ptr + rm[:, None] * N + rn[None, :], acc.to(tl.float16), mask=rm[:, None] < M)
    else:
        tl.atomic_add(o_ptr + rm[:, None] * N + rn[None, :], acc, mask=rm[:, None] < M)


def gemv_yardstick(m: int, k: int, n: int, quick: bool, bandwidth: float) -> None:
    x = torch.randn(m, k, device="cuda", dtype=torch.float16)
    w = torch.randn(k, n, device="cuda", dtype=torch.float16) / 64
    ref = (x.float() @ w.float())
    floor = (x.numel() + w.numel() + m * n) * 2 / bandwidth * 1e6
    configs = [(bn, bk, sp, wp, st) for bn in (32, 64, 128) for bk in (128, 256)
               for sp in (1, 2, 4) for wp in (4,) for st in (3, 5)]
    if quick:
        configs = configs[::3]
    best = None
    for bn, bk, sp, wp, st in configs:
        if n % bn or k % (bk * sp):
            continue
        mp = max(16, triton.next_power_of_2(m))
        grid = (n // bn, sp)

        def run(bn=bn, bk=bk, sp=sp, wp=wp, st=st, mp=mp, grid=grid):
            if sp == 1:
                out = torch.empty(m, n, device="cuda", dtype=torch.float16)
            else:
                out = torch.zeros(m, n, device="cuda", dtype=torch.float32)
            _gemv_kernel[grid](x, w, out, m, n, k // sp, mp, bk, bn, sp, num_warps=wp,
                               num_stages=st)
            return out

        try:
            err = float((run().float() - ref).norm() / ref.norm())
        except Exception as error:  # noqa: BLE001
            log(f"gemv {bn},{bk},{sp}: {type(error).__name__}: {str(error)[:80]}")
            continue
        us = profile_callable(run, warmup=5, reps=50).microseconds
        rec = {"part": "gemv", "shape": [m, k, n], "bn": bn, "bk": bk, "split": sp, "warps": wp,
               "stages": st, "us": us, "err": err, "floor_us": floor}
        RESULTS.append(rec)
        if best is None or us < best["us"]:
            best = rec
    if best:
        print(f"gemv yardstick {m}x{k}x{n}: best {best['us']:.1f} us (floor {floor:.1f}) "
              f"bn={best['bn']} bk={best['bk']} split={best['split']} stages={best['stages']} "
              f"err {best['err']:.1e}")


def mugraph_gemv(quick: bool, bandwidth: float) -> None:
    from mugraph import compile as mg_compile
    from mugraph.library import WORKLOADS

    cases = [
        ("rmsnorm_linear", {"m": 2, "k": 4096, "n": 6144},
         lambda x, w: (x.float() / x.float().pow(2).mean(-1, keepdim=True).sqrt()) @ w.float()),
        ("gated_mlp", {"m": 8, "k": 4096, "n": 4096},
         lambda x, w1, w3: torch.nn.functional.silu(x.float() @ w1.float())
         * (x.float() @ w3.float())),
    ]
    tilings = [(32, 128), (32, 256), (64, 128), (64, 256), (128, 128)]
    launches = [(4, 3), (4, 5), (8, 4)] if not quick else [(4, 4)]
    for name, sizes, ref_fn in cases:
        best = None
        for n_tile, k_tile in tilings:
            graph = WORKLOADS[name].optimized({**sizes, "n_tile": n_tile, "k_tile": k_tile})
            inputs = [torch.randn(t.dims, device="cuda", dtype=torch.float16) / 8
                      for t in graph.input_types]
            ref = ref_fn(*inputs)
            nbytes = sum(t.numel() * 2 for t in inputs) + ref.numel() * 2
            floor = nbytes / bandwidth * 1e6
            for warps, stages in launches:
                try:
                    prog = mg_compile(graph, check=False, num_warps=warps, num_stages=stages)
                    out = prog(inputs=inputs)[0]
                    err = float((out.float() - ref).norm() / ref.norm())
                except Exception as error:  # noqa: BLE001
                    log(f"{name} {n_tile},{k_tile},{warps},{stages}: {type(error).__name__}: "
                        f"{str(error)[:100]}")
                    continue
                us = profile_callable(lambda p=prog, i=inputs: p(inputs=i), warmup=5,
                                      reps=50).microseconds
                rec = {"part": "mugraph-gemv", "name": name, "n_tile": n_tile, "k_tile": k_tile,
                       "warps": warps, "stages": stages, "us": us, "err": err, "floor_us": floor}
                RESULTS.append(rec)
                if best is None or us < best["us"]:
                    best = rec
        if best:
            print(f"mugraph {name}: best {best['us']:.1f} us (floor {best['floor_us']:.1f}) "
                  f"n_tile={best['n_tile']} k_tile={best['k_tile']} warps={best['warps']} "
                  f"stages={best['stages']} err {best['err']:.1e}")


def attention(rows: list[str], quick: bool) -> None:
    from benchmarks.suite import select
    from benchmarks.suite.mugraphs import hand_written_choice
    from benchmarks.suite.tensors import make_inputs, rel_error

    for row in select(rows):
        inputs = make_inputs(row.program(), torch.device("cuda"), seed=0)
        ref = row.torch_fn(*[t.float() for t in inputs])
        choice = hand_written_choice(row)
        q, k, v = inputs
        sdpa = profile_callable(
            lambda q=q, k=k, v=v: torch.nn.functional.scaled_dot_product_attention(
                q, k.transpose(-1, -2), v, scale=1.0), warmup=5, reps=50).microseconds
        best = None
        cands = choice.candidates[:4] if quick else choice.candidates
        for label, graph in cands:
            from mugraph import compile as mg_compile
            try:
                prog = mg_compile(graph, check=False)
                out = prog(inputs=list(inputs))[0]
                err = rel_error(out, ref)
            except Exception as error:  # noqa: BLE001
                log(f"{row.name} {label}: {type(error).__name__}: {str(error)[:100]}")
                continue
            us = profile_callable(lambda p=prog, i=list(inputs): p(inputs=i), warmup=5,
                                  reps=50).microseconds
            kernels = [(k.name, k.grid) for k in prog.kernels]
            rec = {"part": "attention", "row": row.name, "label": label, "us": us, "err": err,
                   "sdpa_us": sdpa, "kernels": kernels,
                   "launch": {i: (c.num_warps, c.num_stages)
                              for i, c in prog.launch_configs.items()}}
            RESULTS.append(rec)
            log(f"{row.name} {label}: {us:.1f} us err {err:.1e} {kernels}")
            if best is None or us < best["us"]:
                best = rec
        if best:
            print(f"attention {row.name}: best {best['us']:.1f} us ({best['label']}, err "
                  f"{best['err']:.1e}) SDPA {sdpa:.1f} us")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--out", default=".")
    parser.add_argument("--parts", default="gemv,mugraph-gemv,attention")
    parser.add_argument("--rows", default="gqa_b1,gqa_llama70b_decode_b1,mqa_falcon7b_decode_b1,"
                        "mqa_b1,gqa_llama70b_spec_b1")
    args = parser.parse_args()
    started = time.time()
    a = torch.empty(256 * 1024**2 // 2, device="cuda", dtype=torch.float16)
    b = torch.empty_like(a)
    copy_us = profile_callable(lambda: b.copy_(a), warmup=3, reps=20, flush_l2=False).seconds
    bandwidth = 2 * a.numel() * 2 / copy_us
    print(f"copy bandwidth {bandwidth / 1e12:.2f} TB/s; {torch.cuda.get_device_name()}; "
          f"torch {torch.__version__}; triton {triton.__version__}")
    parts = args.parts.split(",")
    if "gemv" in parts:
        for m, k, n in ((2, 4096, 6144), (8, 4096, 4096), (1, 4096, 14336)):
            gemv_yardstick(m, k, n, args.quick, bandwidth)
    if "mugraph-gemv" in parts:
        mugraph_gemv(args.quick, bandwidth)
    if "attention" in parts:
        attention(args.rows.split(","), args.quick)
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / "probe.json").write_text(json.dumps(RESULTS, indent=1))
    print(f"done in {time.time() - started:.0f} s")


if __name__ == "__main__":
    main()
