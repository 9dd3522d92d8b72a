"""How the code generator's GEMV forms compare on the search's own μGraphs (GPU).

    python -m benchmarks.probe_gemv_forms [--rows R1,R2] [--graphs 4] [--budget 240] [--out DIR]

For each row, the μGraph ``benchmarks/searched/ROW.json`` chose and its first alternatives are
compiled with each ``gemv_form`` of :class:`mugraph.codegen.triton_gen.CodegenOptions`
(``broadcast``: a cross-thread sum per loop iteration; ``defer``: whole [K, N] products summed
over the loop, reduced once; ``dot``: the row padded to 16 zero rows, ``tl.dot``), each under a
few launch settings; a form that generates the same source as ``broadcast`` (no matrix-vector
accumulator in the graph) is skipped. Every program is first compared with the row's PyTorch
function (relative error below 1e-2), then timed like the suite (median of CUDA-event times,
L2 flushed). The programs are compiled in parallel worker processes first (Triton's on-disk
cache then serves the timing process). A table is printed last; ``--out`` keeps the rows.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

ROWS = ("gated_mlp_llama3_8b_b1", "rmsnorm_linear_llama3_8b_b1", "gated_mlp_b1",
        "rmsnorm_linear_b1", "lora_llama7b_b1", "lora_b1", "mlp_adapter_b8")
FORMS = ("broadcast", "defer", "dot")
LAUNCHES = ((2, 4), (4, 3), (4, 4), (8, 3))
SEARCHED = Path(__file__).resolve().parent / "searched"


def log(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def row_graphs(row: str, count: int) -> list[tuple[str, str]]:
    """(label, graph JSON) of the chosen μGraph and the first alternatives, distinct."""
    data = json.loads((SEARCHED / f"{row}.json").read_text())
    found = [("chosen", json.dumps(data["graph"]))] if "graph" in data else []
    for k, alt in enumerate(data.get("alternatives", [])):
        text = json.dumps(alt["graph"])
        if all(text != g for _, g in found):
            found.append((f"alt{k}", text))
    return found[: count + 1]


def _program(graph_text: str, form: str, launch: tuple[int, int]):
    import mugraph
    from mugraph.ir.ops import OpKind
    from mugraph.runtime.compiled import LaunchConfig

    graph = mugraph.from_json(graph_text)
    configs = {i: LaunchConfig(*launch) for i, op in enumerate(graph.ops)
               if op.kind is OpKind.CUSTOMIZED}
    return graph, mugraph.compile(graph, launch=configs, check=False, gemv_form=form)


def variants(graph_text: str) -> list[tuple[str, tuple[int, int]]]:
    """(form, launch) worth timing: forms whose source differs from the broadcast one."""
    sources = {}
    for form in FORMS:
        _, program = _program(graph_text, form, LAUNCHES[0])
        sources[form] = program.source if isinstance(program.source, str) else program.source()
    forms = [f for f in FORMS if f == "broadcast" or sources[f] != sources["broadcast"]]
    return [(f, launch) for f in forms for launch in LAUNCHES]


def warm(job: tuple[str, str, tuple[int, int]]) -> str:
    """Compile one variant and run it once (fills Triton's cache); '' or the error."""
    graph_text, form, launch = job
    try:
        import torch

        from benchmarks.suite.tensors import make_inputs

        graph, program = _program(graph_text, form, launch)
        program(make_inputs(graph, "cuda", 0))
        torch.cuda.synchronize()
        return ""
    except Exception as error:  # noqa: BLE001 - reported in the table
        return f"{type(error).__name__}: {str(error)[:120]}"


def measure(row_name: str, label: str, graph_text: str, form: str, launch, reps: int) -> dict:
    from benchmarks.suite.rows import select
    from benchmarks.suite.tensors import make_inputs, rel_error
    from mugraph.optimize import profile_callable

    (row,) = select([row_name])
    graph, program = _program(graph_text, form, launch)
    inputs = make_inputs(graph, "cuda", 1)
    out = program(inputs)[0]
    ref = row.torch_fn(*[x.float() for x in inputs])
    err = rel_error(out.float(), ref.float())
    rec = dict(row=row_name, graph=label, form=form, warps=launch[0], stages=launch[1],
               rel_err=err)
    if err >= 1e-2:
        rec["us"] = None
        return rec
    rec["us"] = profile_callable(lambda: program(inputs), reps=reps).microseconds
    return rec


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", default=",".join(ROWS))
    p.add_argument("--graphs", type=int, default=3, help="alternatives after the chosen one")
    p.add_argument("--budget", type=float, default=240.0, help="seconds for the timing")
    p.add_argument("--reps", type=int, default=100)
    p.add_argument("--workers", type=int, default=12)
    p.add_argument("--out", default=None)
    args = p.parse_args()
    t0 = time.perf_counter()
    jobs = []
    for row in args.rows.split(","):
        for label, text in row_graphs(row, args.graphs):
            for form, launch in variants(text):
                jobs.append((row, label, text, form, launch))
    log(f"{len(jobs)} variants; compiling in {args.workers} processes")
    with ProcessPoolExecutor(args.workers,
                             mp_context=multiprocessing.get_context("spawn")) as pool:
        errors = list(pool.map(warm, [(text, form, launch) for _, _, text, form, launch in jobs]))
    log(f"compiled in {time.perf_counter() - t0:.0f} s")
    records = []
    deadline = time.perf_counter() + args.budget
    for (row, label, text, form, launch), error in zip(jobs, errors, strict=True):
        if time.perf_counter() > deadline:
            break
        if error:
            records.append(dict(row=row, graph=label, form=form, warps=launch[0],
                                stages=launch[1], us=None, error=error))
            continue
        records.append(measure(row, label, text, form, launch, args.reps))
    if args.out:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        (Path(args.out) / "gemv_forms.json").write_text(json.dumps(records, indent=1))
    print_table(records)
    return 0


def print_table(records: list[dict]) -> None:
    """Per row and graph: the best time of each form (its launch), then the best per row."""
    print("| row | graph | broadcast µs | defer µs | dot µs |")
    print("| --- | --- | --- | --- | --- |")
    keys = sorted({(r["row"], r["graph"]) for r in records}, key=lambda k: (k[0], k[1] != "chosen",
                                                                            k[1]))
    for row, graph in keys:
        cells = []
        for form in FORMS:
            tried = [r for r in records if (r["row"], r["graph"], r["form"]) == (row, graph, form)]
            timed = [r for r in tried if r.get("us")]
            if not timed:
                cells.append("fail" if tried else "-")
                continue
            best = min(timed, key=lambda r: r["us"])
            cells.append(f"{best['us']:.1f} ({best['warps']}w{best['stages']}s)")
        print(f"| {row} | {graph} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    sys.exit(main())
