"""Where the attention rows' time goes (GPU): the search's kernels beside SDPA and a plain
Triton split-KV kernel as a yardstick.

    python -m benchmarks.probe_attention [--rows gqa_b8,mqa_b8] [--out DIR]

For each row: SDPA's best backend; the program itself through mugraph's runtime (operator by
operator, and captured in a CUDA graph); the search's winner (``benchmarks/searched/<row>.json``)
with its recorded launch settings and over a few warps / stages; and ``yardstick``: a
hand-written Triton split-KV kernel
(2-D tiles, the log-sum-exp merge in a second kernel) over block sizes and splits. Times are
medians of CUDA-event times with the L2 cache flushed (``profile_callable``); every output is
compared with PyTorch's float32 result first.

Its first form (commit 57697c1) also rewrote the kernels' source with 2-D tiles: the
experiment behind the code generator's own 2-D tiles (``squeezed_lead`` in
:mod:`mugraph.codegen.triton_gen`, ``CODEGEN_REVISION`` 2; table in ``benchmarks/RESULTS.md``).
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
from pathlib import Path

import torch
import triton
import triton.language as tl

from benchmarks.suite.baselines import sdpa_candidates
from benchmarks.suite.mugraphs import load_searched
from benchmarks.suite.rows import ROWS
from benchmarks.suite.tensors import make_inputs, rel_error
from mugraph.optimize import profile_callable
from mugraph.runtime import compiled as runtime

DEFAULT_ROWS = ("gqa_b1", "gqa_b8", "mqa_b8", "mha_b8", "gqa_llama70b_spec_b8",
                "mqa_falcon7b_decode_b1", "mqa_falcon7b_decode_b8")
RESULTS: list[dict] = []


def log(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


# ---- yardstick: split-KV attention with a log-sum-exp merge --------------------------------


@triton.jit
def _split_kernel(q_ptr, k_ptr, v_ptr, o_ptr, m_ptr, l_ptr, S, N,
                  sqh, sqs, skh, skn, skd, svh, svn,
                  SPLIT, D: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr):
    pid_m = tl.program_id(0)
    h = tl.program_id(1)
    sp = tl.program_id(2)
    rm = pid_m * BM + tl.arange(0, BM)
    rd = tl.arange(0, D)
    rn = tl.arange(0, BN)
    q = tl.load(q_ptr + h * sqh + rm[:, None] * sqs + rd[None, :], mask=rm[:, None] < S,
                other=0.0)
    m = tl.full([BM], float("-inf"), tl.float32)
    lsum = tl.zeros([BM], tl.float32)
    acc = tl.zeros([BM, D], tl.float32)
    chunk = N // SPLIT
    for start in range(sp * chunk, sp * chunk + chunk, BN):
        k = tl.load(k_ptr + h * skh + rd[:, None] * skd + (start + rn)[None, :] * skn)
        s = tl.dot(q, k)
        m_new = tl.maximum(m, tl.max(s, 1))
        alpha = tl.exp(m - m_new)
        p = tl.exp(s - m_new[:, None])
        lsum = lsum * alpha + tl.sum(p, 1)
        v = tl.load(v_ptr + h * svh + (start + rn)[:, None] * svn + rd[None, :])
        acc = acc * alpha[:, None] + tl.dot(p.to(tl.float16), v)
        m = m_new
    base = (sp * tl.num_programs(1) + h) * S
    tl.store(o_ptr + (base + rm[:, None]) * D + rd[None, :], acc, mask=rm[:, None] < S)
    tl.store(m_ptr + base + rm, m, mask=rm < S)
    tl.store(l_ptr + base + rm, lsum, mask=rm < S)


@triton.jit
def _merge_kernel(o_ptr, m_ptr, l_ptr, out_ptr, HS, SPLIT, D: tl.constexpr, BR: tl.constexpr):
    r = tl.program_id(0) * BR + tl.arange(0, BR)
    rd = tl.arange(0, D)
    mask = r < HS
    mx = tl.full([BR], float("-inf"), tl.float32)
    for sp in range(SPLIT):
        mx = tl.maximum(mx, tl.load(m_ptr + sp * HS + r, mask=mask, other=0.0))
    total = tl.zeros([BR], tl.float32)
    acc = tl.zeros([BR, D], tl.float32)
    for sp in range(SPLIT):
        w = tl.exp(tl.load(m_ptr + sp * HS + r, mask=mask, other=0.0) - mx)
        total += w * tl.load(l_ptr + sp * HS + r, mask=mask, other=0.0)
        o = tl.load(o_ptr + (sp * HS + r[:, None]) * D + rd[None, :], mask=mask[:, None],
                    other=0.0)
        acc += w[:, None] * o
    tl.store(out_ptr + r[:, None] * D + rd[None, :], (acc / total[:, None]).to(tl.float16),
             mask=mask[:, None])


def yardstick(q, k, v, bm: int, bn: int, split: int, warps: int, stages: int):
    """A callable for the split-KV kernel on the program's [h, s, d] x [h, d, n] x [h, n, d]."""
    h, s, d = q.shape
    n = v.shape[1]
    o = torch.empty(split, h, s, d, dtype=torch.float32, device=q.device)
    m = torch.empty(split, h, s, dtype=torch.float32, device=q.device)
    lsum = torch.empty_like(m)
    out = torch.empty_like(q)
    grid = (triton.cdiv(s, bm), h, split)
    br = 64

    def call():
        _split_kernel[grid](q, k, v, o, m, lsum, s, n, q.stride(0), q.stride(1), k.stride(0),
                            k.stride(2), k.stride(1), v.stride(0), v.stride(1), split, D=d,
                            BM=bm, BN=bn, num_warps=warps, num_stages=stages)
        _merge_kernel[(triton.cdiv(h * s, br),)](o, m, lsum, out, h * s, split, D=d, BR=br,
                                                 num_warps=4)
        return out

    return call


def yardstick_configs(s: int, h: int, n: int):
    for bm, bn, warps, stages in itertools.product((16, 32, 64, 128), (64, 128), (4, 8), (2, 3)):
        if bm > max(16, triton.next_power_of_2(s)):
            continue
        blocks = triton.cdiv(s, bm) * h
        for split in (1, 2, 4, 8, 16, 32):
            if n % (split * bn) or (split > 1 and blocks * split > 1024):
                continue
            if blocks * split < 32 and split < 32 and n % (2 * split * bn) == 0:
                continue  # too few blocks: a larger split is tried
            yield bm, bn, split, warps, stages


# ---- the probe ----------------------------------------------------------------------------------


def measure(fn, ref, reps: int) -> tuple[float, float]:
    """(median µs, relative error); inf when it fails or disagrees."""
    try:
        out = fn()
        torch.cuda.synchronize()
        err = rel_error(out, ref)
    except Exception as error:  # noqa: BLE001 - a failing variant scores infinity
        log(f"      failed: {type(error).__name__}: {str(error)[:200]}")
        return float("inf"), float("inf")
    if not err < 1e-2:
        return float("inf"), err
    t = profile_callable(fn, reps=reps)
    return t.seconds * 1e6, err


def compiled_call(graph, inputs, launch):
    program = runtime.compile_graph(graph, launch=launch, check=False)
    return lambda: program(inputs)[0]


def probe_row(name: str, reps: int) -> dict:
    row = ROWS[name]
    program = row.program()
    inputs = make_inputs(program, "cuda", seed=0)
    ref = row.torch_fn(*[x.float() for x in inputs])
    rec: dict = {"row": name}
    sdpa = [(label, measure(fn, ref, reps)[0]) for label, fn in sdpa_candidates(row, inputs)]
    rec["sdpa"] = min(t for _, t in sdpa)
    log(f"{name}: SDPA {rec['sdpa']:.1f} µs")
    for graphed in (False, True):
        prog = runtime.compile_graph(program, check=False, cuda_graph=graphed)
        key = "program_graphed" if graphed else "program_ops"
        rec[key] = measure(lambda p=prog: p(inputs)[0], ref, reps)[0]
    log(f"  program through the runtime: {rec['program_ops']:.1f} µs op by op, "
        f"{rec['program_graphed']:.1f} µs captured")
    graph, doc = load_searched(row, program)
    if graph is not None:
        recorded = {int(k): tuple(v) for k, v in (doc.get("launch") or {}).items()}
        rec["searched_recorded"] = time_graph(graph, inputs, ref, reps, [recorded])[0]
        swept = time_graph(graph, inputs, ref, reps, [(2, 3), (4, 2), (4, 3), (8, 2), (8, 3)])
        rec["searched"], rec["searched_launch"] = min(swept, (rec["searched_recorded"],
                                                              "recorded"))
        log(f"  searched: recorded {rec['searched_recorded']:.1f}, best {rec['searched']:.1f} "
            f"({rec['searched_launch']})")
    q, k, v = inputs
    best = (float("inf"), "")
    for bm, bn, split, warps, stages in yardstick_configs(q.shape[1], q.shape[0], v.shape[1]):
        t, _ = measure(yardstick(q, k, v, bm, bn, split, warps, stages), ref, reps)
        best = min(best, (t, f"bm{bm} bn{bn} split{split} {warps}w{stages}s"))
    rec["yardstick"], rec["yardstick_config"] = best
    log(f"  yardstick: {best[0]:.1f} ({best[1]})")
    return rec


def time_graph(graph, inputs, ref, reps: int, settings) -> tuple[float, str]:
    """The fastest (µs, label) of ``graph`` over launch settings: (warps, stages) for every
    kernel, or a dict of them per kernel."""
    best = (float("inf"), "")
    for setting in settings:
        if isinstance(setting, dict):
            launch = {i: runtime.LaunchConfig(*v) for i, v in setting.items()}
            label = "recorded"
        else:
            launch = {i: runtime.LaunchConfig(*setting) for i in _kernels(graph)}
            label = f"{setting[0]}w{setting[1]}s"
        try:
            call = compiled_call(graph, inputs, launch)
        except Exception as error:  # noqa: BLE001 - reported, scored infinity
            log(f"      compile failed: {type(error).__name__}: {str(error)[:200]}")
            continue
        best = min(best, (measure(call, ref, reps)[0], label))
    return best


def _kernels(graph) -> list[int]:
    from mugraph.ir.ops import OpKind

    return [i for i, op in enumerate(graph.ops) if op.kind is OpKind.CUSTOMIZED]


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", default=",".join(DEFAULT_ROWS))
    parser.add_argument("--reps", type=int, default=50)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    for name in args.rows.split(","):
        try:
            RESULTS.append(probe_row(name, args.reps))
        except Exception as error:  # noqa: BLE001 - the other rows still run
            log(f"{name}: failed: {type(error).__name__}: {error}")
    cols = ("sdpa", "program_ops", "program_graphed", "searched_recorded", "searched",
            "yardstick")
    print("| row | " + " | ".join(cols) + " | best launch | yardstick config |")
    print("| --- " * (len(cols) + 3) + "|")
    for rec in RESULTS:
        cells = [f"{rec.get(c, float('nan')):.1f}" for c in cols]
        print(f"| {rec['row']} | " + " | ".join(cells)
              + f" | {rec.get('searched_launch', '')} | {rec.get('yardstick_config', '')} |")
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "probe_attention.json").write_text(json.dumps(RESULTS, indent=1))


if __name__ == "__main__":
    main()
