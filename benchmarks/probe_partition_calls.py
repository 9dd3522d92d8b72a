"""Host cost of one mugraph partition call, layer by layer of the call path, on a GPU.

    python benchmarks/probe_partition_calls.py --cache-dir DIR [--layers 2] [--phase decode]

Compiles the Llama-3.2-1B-sized model of ``bench_models`` (``--layers`` layers) with
``backend="mugraph"``, runs the phase three times, then for every partition mugraph runs
times N back-to-back calls of each layer of the call path on the inputs of its last call
(microseconds per call, wall, the GPU synchronized only around the N calls): the operator
``torch.ops.mugraph.partition``, the partition module, its ``_run``, the compiled program's
call, the fast plan's call, and the partition's PyTorch nodes eager and compiled by Inductor
alone. It also counts, during one more call of the phase, the compiled programs' calls that
missed their fast plan and the weight-folding recomputations.
"""

from __future__ import annotations

import argparse
import copy
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))


def per_call_us(fn, n: int) -> float:
    import torch

    fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / n * 1e6


def _time_partition(key: int, part, raw: tuple, args) -> dict:
    """Microseconds per call of each layer of one partition's call path (``raw``: the
    operator's inputs; the partition's own raw inputs are made from them when it prepares
    weights inside the call)."""
    import torch

    from mugraph.runtime import compiled as rc

    given = list(raw)
    raw = tuple(part._raw(given)) if part._prepared is not None else tuple(given)
    inputs = part._inputs(raw)
    program = part._compiled
    plans = list(program._plans.values()) if program is not None else []
    row = {"plans": len(plans), "note": program.plan_note if program is not None else ""}
    row["op"] = per_call_us(lambda: torch.ops.mugraph.partition(key, given), args.n)
    row["run_op"] = per_call_us(lambda: part.run_op(given), args.n)
    if part._prepared is not None:
        row["_raw"] = per_call_us(lambda: part._raw(given), args.n)
    row["module"] = per_call_us(lambda: part(*raw), args.n)
    row["_run"] = per_call_us(lambda: part._run(raw), args.n)
    row["_inputs"] = per_call_us(lambda: part._inputs(raw), args.n)
    row["program"] = per_call_us(lambda: program(inputs=inputs), args.n)
    outs = program(inputs=inputs)
    row["outputs"] = per_call_us(lambda: [part._shaped(outs[i], k).contiguous()
                                          for k, i in enumerate(part.output_index)], args.n)
    plan = program._plan_for(inputs) if program is not None else None
    if isinstance(plan, rc._Plan):
        row["plan.call"] = per_call_us(lambda: plan.call(inputs), args.n)
        row["launches"] = len(plan.launches)
        row["matches"] = per_call_us(lambda: plan.matches(inputs), args.n)
        row["stream"] = per_call_us(lambda: rc._current_stream(plan.device_index), args.n)
        row["empty"] = per_call_us(lambda: [
            torch.empty_strided(shape, strides, dtype=dtype, device=plan.device)
            for shape, strides, dtype in plan.fresh_specs], args.n)
        fresh = [torch.empty_strided(shape, strides, dtype=dtype, device=plan.device)
                 for shape, strides, dtype in plan.fresh_specs]
        stream = rc._current_stream(plan.device_index)
        row["launch"] = per_call_us(lambda: plan.launch(fresh, inputs, stream), args.n)
    row["eager"] = per_call_us(lambda: part.fallback(*raw), args.n)
    if args.inductor:
        try:
            from torch._inductor.compile_fx import compile_fx

            ind = compile_fx(part.fallback, list(raw))
            row["inductor"] = per_call_us(lambda: ind(*raw), args.n)
        except Exception as error:  # noqa: BLE001 - report and go on
            row["inductor_error"] = f"{type(error).__name__}: {str(error)[:120]}"
    return row


def main() -> None:
    import torch

    import mugraph.integration as mgi
    from benchmarks.bench_models import (
        LLAMA_1B,
        build,
        compiled_model,
        decode_fn,
        decode_setup,
        prefill_fn,
    )
    from mugraph.integration import runtime as rt
    from mugraph.integration import torch_ops
    from mugraph.runtime import compiled as rc

    parser = argparse.ArgumentParser()
    parser.add_argument("--cache-dir", default=None)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--phase", default="decode", choices=["prefill", "decode"])
    parser.add_argument("--n", type=int, default=200)
    parser.add_argument("--inductor", action="store_true",
                        help="also time each partition's nodes compiled by Inductor alone")
    args = parser.parse_args()
    sizes = dict(LLAMA_1B, num_hidden_layers=args.layers)
    model = build(sizes, torch.float16, "cuda")
    options = {"time_limit": 60, "cache_dir": args.cache_dir, "rest": "inductor"}
    compiled = compiled_model(model, "mugraph", options)
    if args.phase == "prefill":
        ids = torch.randint(0, sizes["vocab_size"], (1, 512), device="cuda")
        fn = prefill_fn(compiled, ids)
    else:
        cache0, token = decode_setup(model, 1024, sizes["vocab_size"], "cuda")
        fn = decode_fn(compiled, copy.deepcopy(cache0), token, 1024)
    last: dict[int, tuple] = {}
    run_op = rt.MugraphPartition.run_op

    def recording(self, raw):
        last[id(self)] = tuple(raw)
        return run_op(self, raw)

    rt.MugraphPartition.run_op = recording
    with torch.no_grad():
        for _ in range(3):
            fn()
        counts = {"checked": 0, "fold": 0}
        checked, memo_get = rc.CompiledProgram._call_checked, torch_ops._Memo.get

        def counting_checked(self, inputs):
            counts["checked"] += 1
            return checked(self, inputs)

        def counting_get(self, key, tensors, compute):
            def counted():
                counts["fold"] += 1
                return compute()
            return memo_get(self, key, tensors, counted)

        rc.CompiledProgram._call_checked = counting_checked
        torch_ops._Memo.get = counting_get
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        wall = (time.perf_counter() - t0) * 1e3
        rc.CompiledProgram._call_checked, torch_ops._Memo.get = checked, memo_get
        print(f"one {args.phase} call: {wall:.3f} ms wall; compiled-program calls off the fast "
              f"path: {counts['checked']}; weight folds recomputed: {counts['fold']}")
        rows = []
        seen = set()
        for key, part in rt._PARTITIONS.items():
            raw = last.get(id(part))
            if raw is None or not part.use_mugraph:
                continue
            name = getattr(part.report, "name", "?")
            klass = getattr(part.report, "shape_class", "") or ""
            group = (klass, tuple((tuple(t.shape), t.dtype) for t in raw
                                  if isinstance(t, torch.Tensor)))
            if group in seen:
                continue
            seen.add(group)
            row = {"partition": f"{name} [{klass}]", **_time_partition(key, part, raw, args)}
            rows.append(row)
            print(row, flush=True)
    cols = ["op", "run_op", "_raw", "_inputs", "program", "outputs", "plan.call", "matches",
            "stream", "empty", "launch", "launches", "eager", "inductor"]
    print("\n| partition | " + " | ".join(cols) + " |\n|" + " --- |" * (len(cols) + 1))
    for r in rows:
        cells = [f"{r[c]:.1f}" if isinstance(r.get(c), float) else str(r.get(c, "-"))
                 for c in cols]
        print(f"| {r['partition']} | " + " | ".join(cells) + " |")
    for report in mgi.reports():
        print(report.format())


if __name__ == "__main__":
    main()
