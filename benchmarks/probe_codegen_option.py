"""Experiments behind code-generation options (GPU): each suite row's searched μGraph compiled
with a ``CodegenOptions`` flag off and on, and (for ``stream_loads``) a plain read.

    python -m benchmarks.probe_codegen_option [--option stream_loads] [--rows ROW ...]
        [--reps 100] [--out FILE] [--no-read]

Per row: what ``superoptimize`` returns from ``benchmarks/searched/cache`` (as the suite
runner compiles it), compiled with the option off and on, timed as the suite times (median of
CUDA-event times, L2 flushed), in the order off, on, off, on; whether the two outputs are
bit-identical is recorded, and the error of the second against PyTorch's float32 result.
``stream_loads``: the evict-first L2 policy on tiles no other block reads. ``chain_launches``:
a kernel of partial results and the kernel combining them in one launch.
``read`` (stream_loads only): one Triton kernel summing a tensor of 50 and 235 MB (the
rmsnorm_linear and gated_mlp_llama3_8b weights), with and without the hint, with the L2
flushed before each run (the flush leaves L2 full of dirty lines) and without.
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
import time

import torch
import triton
import triton.language as tl

from benchmarks.suite.mugraphs import superoptimized
from benchmarks.suite.rows import select
from benchmarks.suite.tensors import make_inputs, rel_error
from mugraph.optimize import profile_callable
from mugraph.runtime.compiled import compile_graph


def log(line: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {line}", file=sys.stderr, flush=True)


@triton.jit
def _read_kernel(x_ptr, o_ptr, n_per_block, BLOCK: tl.constexpr, EVICT: tl.constexpr):
    pid = tl.program_id(0)
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for start in range(0, n_per_block, BLOCK):
        offs = pid * n_per_block + start + tl.arange(0, BLOCK)
        if EVICT:
            acc += tl.load(x_ptr + offs, eviction_policy="evict_first").to(tl.float32)
        else:
            acc += tl.load(x_ptr + offs).to(tl.float32)
    tl.store(o_ptr + pid, tl.sum(acc, axis=0))


def _read(x, out, blocks: int, per_block: int, evict: int) -> None:
    _read_kernel[(blocks,)](x, out, per_block, 4096, evict, num_warps=8)


def read_probe(reps: int) -> list[dict]:
    rows = []
    for mbytes in (50, 235):
        blocks = 132 * 8
        per_block = (mbytes * 2**20 // 2 // blocks) // 4096 * 4096
        x = torch.randn(blocks * per_block, device="cuda", dtype=torch.float16)
        out = torch.empty(blocks, device="cuda", dtype=torch.float32)
        for flush in (True, False):
            for evict in (0, 1, 0, 1):
                fn = functools.partial(_read, x, out, blocks, per_block, evict)
                us = profile_callable(fn, reps=reps, flush_l2=flush).microseconds
                rows.append({"read_mb": x.numel() * 2 / 2**20, "flush": flush,
                             "evict_first": bool(evict), "us": us,
                             "tb_s": x.numel() * 2 / us / 1e6})
                log(json.dumps(rows[-1]))
    return rows


def row_probe(row, reps: int, option: str) -> dict:
    graph, source, note = superoptimized(row)
    rec = {"row": row.name, "source": source}
    if graph is None or source != "searched":
        rec["note"] = note
        return rec
    program = row.program()
    inputs = make_inputs(program, "cuda", 1234)
    with torch.no_grad():
        ref = row.torch_fn(*[x.float() for x in inputs])
    variants = {flag: compile_graph(graph, check=False, **{option: flag})
                for flag in (False, True)}
    outs = {flag: p(inputs=inputs)[0] for flag, p in variants.items()}
    rec["err"] = rel_error(outs[True], ref)
    rec["equal"] = bool(torch.equal(outs[False], outs[True]))
    times: dict[bool, list[float]] = {False: [], True: []}
    for flag in (False, True, False, True):
        p = variants[flag]
        times[flag].append(profile_callable(lambda p=p: p(inputs=inputs), reps=reps).microseconds)
    rec["off_us"], rec["on_us"] = times[False], times[True]
    rec["gain"] = min(times[False]) / min(times[True])
    return rec


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", nargs="*", default=[])
    parser.add_argument("--reps", type=int, default=100)
    parser.add_argument("--out", default=None)
    parser.add_argument("--option", default="stream_loads",
                        choices=("stream_loads", "chain_launches"))
    parser.add_argument("--no-read", action="store_true")
    args = parser.parse_args(argv)
    results = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
               "triton": triton.__version__, "reps": args.reps, "option": args.option,
               "rows": [], "read": []}
    if not args.no_read and args.option == "stream_loads":
        results["read"] = read_probe(args.reps)
    for row in select(args.rows):
        try:
            results["rows"].append(row_probe(row, args.reps, args.option))
        except Exception as error:  # noqa: BLE001 - one failing row is reported, not fatal
            results["rows"].append({"row": row.name, "note": f"{type(error).__name__}: {error}"})
        log(json.dumps(results["rows"][-1]))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(results, f, indent=1)
    print(f"{results['device']}, torch {results['torch']}, triton {results['triton']}; "
          f"median of {args.reps} runs, L2 flushed unless said; option {args.option}")
    if results["read"]:
        print("| read MB | L2 flushed | plain µs | evict_first µs | plain TB/s | "
              "evict_first TB/s |")
        print("| --- | --- | --- | --- | --- | --- |")
    for mb in sorted({r["read_mb"] for r in results["read"]}):
        for flush in (True, False):
            cell = [r for r in results["read"] if r["read_mb"] == mb and r["flush"] == flush]
            plain = min(r["us"] for r in cell if not r["evict_first"])
            hint = min(r["us"] for r in cell if r["evict_first"])
            print(f"| {mb:.0f} | {flush} | {plain:.1f} | {hint:.1f} | "
                  f"{mb * 2**20 / plain / 1e6:.2f} | {mb * 2**20 / hint / 1e6:.2f} |")
    print("| row | off µs (2 runs) | on µs (2 runs) | gain | outputs equal | rel err |")
    print("| --- | --- | --- | --- | --- | --- |")
    for r in results["rows"]:
        if "off_us" not in r:
            print(f"| {r['row']} | {r.get('note', '')[:60]} | | | | |")
            continue
        off = " / ".join(f"{t:.1f}" for t in r["off_us"])
        on = " / ".join(f"{t:.1f}" for t in r["on_us"])
        print(f"| {r['row']} | {off} | {on} | {r['gain']:.2f}x | {r['equal']} | "
              f"{r['err']:.1e} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
