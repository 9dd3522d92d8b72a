"""The cost model's features and estimate of every custom kernel of the known graphs
(tests/known_graphs.py), stored in tests/golden/cost_estimates.json: a change to where the
model reads its quantities from (the lowered IR, say) shows here as changed numbers.

``python tests/cost_snapshot.py --write`` rewrites the snapshot; ``--time`` also prints the
cost model's time per kernel (features computed afresh, caches cleared)."""

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


def main() -> int:
    now = estimates()
    if "--time" in sys.argv:
        print(f"{len(now)} kernels, {time_per_kernel() * 1e6:.0f} us per kernel")
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
