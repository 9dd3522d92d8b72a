"""Time each hand-written μGraph of ``mugraph.library`` beside PyTorch eager of its naive form.

On a GPU: for every workload at its suite shapes (``shared/benchmarks.md``, b=1, plus the
library's extra shape sets), the median time with the L2 cache flushed between runs (CUDA
events), the speedup over eager, and whether the μGraph's output matched eager's (relative
error under 1e-2). Without a GPU it prints the cost model's estimates instead. A row that fails
prints its error and the table goes on.

    python benchmarks/bench_handwritten.py [--reps N] [--only NAME] [--tune]
"""

from __future__ import annotations

import argparse
import sys
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from mugraph.codegen.torch_ops import run_torch_op  # noqa: E402
from mugraph.ir.ops import OpKind  # noqa: E402
from mugraph.library import WORKLOADS  # noqa: E402
from mugraph.optimize import estimate, profile_callable  # noqa: E402


def eager(graph):
    """The graph as plain PyTorch calls, without mugraph's input checks (a user's eager code)."""
    ops, outputs = graph.ops, graph.outputs

    def run(inputs):
        values = []
        for op in ops:
            if op.kind is OpKind.INPUT:
                values.append([inputs[op.attr("index")]])
            else:
                values.append([run_torch_op(op, [values[r.op][r.index] for r in op.inputs])])
        return [values[r.op][r.index] for r in outputs]

    return run


def rel_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    out, ref = out.float(), ref.float()
    return float((out - ref).norm() / ref.norm().clamp_min(1e-30))


def rows(only: str | None):
    for name, w in WORKLOADS.items():
        if only and only != name:
            continue
        yield name, "suite", w, w.suite
        for label, sizes in w.extra.items():
            yield name, label, w, sizes


def bench_gpu(reps: int, only: str | None, tune: bool) -> None:
    from mugraph.codegen.check import random_inputs
    from mugraph.runtime.compiled import compile_graph

    print(f"device: {torch.cuda.get_device_name()}  (median of {reps} runs, L2 flushed)")
    print(f"{'workload':<26}{'shapes':<8}{'eager us':>10}{'mugraph us':>12}{'speedup':>9}"
          f"{'est us':>8}{'rel err':>9}  status")
    for name, label, w, sizes in rows(only):
        head = f"{name:<26}{label:<8}"
        try:
            naive, fused = w.naive(sizes), w.optimized(sizes)
            inputs = random_inputs(naive, torch.device("cuda"), seed=0, scale=0.5)
            base = eager(naive)
            if tune:
                from mugraph.optimize import optimize_program

                program = optimize_program(fused, inputs, check=False).program
            else:
                program = compile_graph(fused)
            err = rel_error(program(inputs=inputs)[0], base(inputs)[0])
            t_eager = profile_callable(lambda b=base, x=inputs: b(x), reps=reps)
            t_mg = profile_callable(lambda p=program, x=inputs: p(inputs=x), reps=reps)
            est = estimate(fused).seconds * 1e6
            status = "ok" if err < 1e-2 else "MISMATCH"
            for m, who in ((t_eager, "eager"), (t_mg, "mugraph")):
                if m.error:
                    status = f"{who} failed: {m.error[:80]}"
            speed = t_eager.seconds / t_mg.seconds if t_mg.ok and t_eager.ok else float("nan")
            print(f"{head}{t_eager.microseconds:>10.1f}{t_mg.microseconds:>12.1f}{speed:>8.2f}x"
                  f"{est:>8.1f}{err:>9.1e}  {status}", flush=True)
        except Exception as error:  # noqa: BLE001 - report the row and go on
            print(f"{head}  ERROR {type(error).__name__}: {str(error).splitlines()[0][:160]}")
            traceback.print_exc(limit=3, file=sys.stderr)


def bench_estimates(only: str | None) -> None:
    print("no CUDA device: cost model estimates (mugraph.optimize.estimate, H100)")
    print(f"{'workload':<26}{'shapes':<8}{'naive us':>10}{'fused us':>10}{'ratio':>8}"
          f"{'launches':>10}{'fused MB':>10}")
    for name, label, w, sizes in rows(only):
        head = f"{name:<26}{label:<8}"
        try:
            naive, fused = estimate(w.naive(sizes)), estimate(w.optimized(sizes))
            print(f"{head}{naive.seconds * 1e6:>10.1f}{fused.seconds * 1e6:>10.1f}"
                  f"{naive.seconds / fused.seconds:>7.2f}x{naive.launches:>5}->{fused.launches:<4}"
                  f"{fused.dram_bytes / 1e6:>10.2f}")
        except Exception as error:  # noqa: BLE001
            print(f"{head}  ERROR {type(error).__name__}: {str(error).splitlines()[0][:160]}")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=100)
    parser.add_argument("--only", default=None, help="one workload name")
    parser.add_argument("--tune", action="store_true", help="profile kernel variants first")
    args = parser.parse_args(argv)
    if torch.cuda.is_available():
        bench_gpu(args.reps, args.only, args.tune)
    else:
        bench_estimates(args.only)


if __name__ == "__main__":
    main()
