"""The cost model's features and estimate of every custom kernel of the known graphs
(tests/known_graphs.py), stored in tests/golden/cost_estimates.json: a change to where the
model reads its quantities from (the lowered IR, say) shows here as changed numbers.

``python tests/cost_snapshot.py --write`` rewrites the snapshot; ``--time`` also prints the
cost model's time per kernel (features computed afresh, caches cleared) and the lowering's;
``--lowered`` prints where the lowered IR's footprints (largest register tile, shared memory)
differ from the model's own and what the estimate would become with them, and, over the
H100-timed candidates of benchmarks/ (ranking records and the searches' rankings), how
ranking quality would change (the reason the model keeps its own quantities: see
:mod:`mugraph.optimize.cost_model`)."""

from __future__ import annotations

import dataclasses
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from mugraph.ir.ops import OpKind  # noqa: E402
from mugraph.optimize import cost_model  # noqa: E402

HERE = Path(__file__).resolve().parent
SNAPSHOT = HERE / "golden" / "cost_estimates.json"


def known_graphs():
    sys.path.insert(0, str(HERE))
    from known_graphs import library_graphs, searched_graphs

    yield from library_graphs()
    yield from searched_graphs()


def kernels():
    """(key, block, input types, output types) of every custom kernel of the known graphs."""
    for name, graph in known_graphs():
        for i, op in enumerate(graph.ops):
            if op.kind is OpKind.CUSTOMIZED:
                ins = tuple(graph.tensor_type(r) for r in op.inputs)
                yield f"{name} %{i}", op.attr("graph"), ins, tuple(op.outputs)


def estimates() -> dict[str, dict]:
    found = {}
    for key, block, ins, outs in kernels():
        f = cost_model.kernel_features(block, ins, outs)
        seconds, _ = cost_model.kernel_seconds(f, cost_model.DEFAULT_GPU, cost_model.DEFAULT_PARAMS)
        found[key] = {**dataclasses.asdict(f), "seconds": seconds}
    return found


def time_per_kernel(repeats: int = 3) -> float:
    """Seconds of one kernel's features and estimate, afresh (the best of ``repeats``)."""
    work = list(kernels())
    best = float("inf")
    for _ in range(repeats):
        cost_model.kernel_features.cache_clear()
        start = time.perf_counter()
        for _, block, ins, outs in work:
            f = cost_model.kernel_features(block, ins, outs)
            cost_model.kernel_seconds(f, cost_model.DEFAULT_GPU, cost_model.DEFAULT_PARAMS)
        best = min(best, (time.perf_counter() - start) / len(work))
    return best


def lowering_time_per_kernel(repeats: int = 3) -> float:
    """Seconds of one kernel's lowering (the best of ``repeats``)."""
    from mugraph.codegen.lowered import lower_block

    work = list(kernels())
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        for _, block, _, outs in work:
            lower_block(block, outputs=outs)
        best = min(best, (time.perf_counter() - start) / len(work))
    return best


def with_lowered(block, ins, outs, what: str) -> cost_model.KernelFeatures:
    """The model's features with ``what`` ("tile", "smem" or "both") read from the lowered
    IR instead: the largest register tile's padded elements, the pipelined shared bytes."""
    from mugraph.codegen.lowered import lower_block

    f = cost_model.kernel_features(block, ins, outs)
    kernel = lower_block(block, outputs=outs)
    if what in ("tile", "both"):
        largest = max((t.padded_elements for t in kernel.registers), default=1)
        f = dataclasses.replace(f, largest_tile=largest)
    if what in ("smem", "both"):
        f = dataclasses.replace(f, smem=max(1, kernel.shared_bytes))
    return f


def _seconds(f) -> float:
    return cost_model.kernel_seconds(f, cost_model.DEFAULT_GPU, cost_model.DEFAULT_PARAMS)[0]


def compare_lowered() -> None:
    for key, block, ins, outs in kernels():
        f = cost_model.kernel_features(block, ins, outs)
        tile, smem = (with_lowered(block, ins, outs, w) for w in ("tile", "smem"))
        if tile.largest_tile != f.largest_tile or smem.smem != f.smem:
            print(f"{key:32s} largest tile {f.largest_tile} -> {tile.largest_tile}, "
                  f"smem {f.smem} -> {smem.smem}; estimate {_seconds(f) * 1e6:.2f} us -> "
                  f"{_seconds(tile) * 1e6:.2f} (tile), {_seconds(smem) * 1e6:.2f} (smem)")
    _compare_rankings()


def _compare_rankings() -> None:
    root = HERE.parent
    sys.path.insert(0, str(root / "benchmarks"))
    import ranking_fit

    lines = ranking_fit.read_lines(root / "benchmarks" / "ranking_h100_run1.jsonl.gz")
    lines += ranking_fit.searched_lines(root / "benchmarks" / "searched")
    memo: dict = {}
    cache: dict = {}

    def graph_seconds(graph, what: str) -> float:
        total = 0.0
        for op in graph.ops:
            if op.kind is OpKind.INPUT:
                continue
            if op.kind is not OpKind.CUSTOMIZED:
                total += cost_model._torch_op(graph, op, "", cost_model.DEFAULT_GPU,
                                              cost_model.DEFAULT_PARAMS).seconds
                continue
            ins = tuple(graph.tensor_type(r) for r in op.inputs)
            block, outs = op.attr("graph"), tuple(op.outputs)
            f = (cost_model.kernel_features(block, ins, outs) if what == "model"
                 else with_lowered(block, ins, outs, what))
            total += _seconds(f)
        return total * 1e6

    def estimator(what: str):
        def estimate(line: dict) -> float:
            key = (what, line["row"], line["graph_hash"])
            if key not in cache:
                cache[key] = graph_seconds(ranking_fit.graph_of(line, memo), what)
            return cache[key]
        return estimate

    for what in ("model", "smem", "tile", "both"):
        scores = ranking_fit.summary_scores(lines, estimator(what))
        changed = sum(1 for line in lines if line.get("graph")
                      and estimator(what)(line) != estimator("model")(line))
        print(f"{what:6s} mean rho {scores['mean_rho']:.4f}  pooled rho "
              f"{scores['pooled_rho']:.4f}  pick/best {scores['geo_regret']:.4f}  "
              f"estimates changed {changed} of {len(lines)}")


def main() -> int:
    now = estimates()
    if "--time" in sys.argv:
        print(f"{len(now)} kernels, cost model {time_per_kernel() * 1e6:.0f} us per kernel, "
              f"lowering {lowering_time_per_kernel() * 1e6:.0f} us per kernel")
    if "--lowered" in sys.argv:
        compare_lowered()
    if "--write" in sys.argv:
        SNAPSHOT.write_text(json.dumps(now, indent=0, sort_keys=True) + "\n")
        print(f"wrote {len(now)} estimates to {SNAPSHOT}")
        return 0
    stored = json.loads(SNAPSHOT.read_text())
    changed = 0
    for key in sorted(stored.keys() | now.keys()):
        old, new = stored.get(key, {}), now.get(key, {})
        diff = {k: (old.get(k), new.get(k)) for k in old.keys() | new.keys()
                if old.get(k) != new.get(k)}
        if diff:
            changed += 1
            print(key, diff)
    print(f"{len(now)} kernels, {changed} changed")
    return 1 if changed else 0


if __name__ == "__main__":
    sys.exit(main())
