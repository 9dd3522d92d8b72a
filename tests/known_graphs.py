"""Graphs several test modules run over: the library's μGraphs (naive and hand-written, at
their small sizes) and the winners the suite's searches stored in ``benchmarks/searched``."""

from __future__ import annotations

import json
from pathlib import Path

from mugraph.ir.serialize import from_json
from mugraph.library import WORKLOADS

ROOT = Path(__file__).resolve().parents[1]


def library_graphs():
    """(name, graph) of every library workload's naive and hand-written forms."""
    for name, workload in sorted(WORKLOADS.items()):
        yield f"{name}/naive", workload.naive(workload.small)
        yield f"{name}/optimized", workload.optimized(workload.small)


def searched_graphs():
    """(row, graph) of every stored search winner."""
    for path in sorted((ROOT / "benchmarks" / "searched").glob("*.json")):
        data = json.loads(path.read_text())
        if isinstance(data, dict) and isinstance(data.get("graph"), dict):
            yield path.stem, from_json(data["graph"])


def one_kernel(inputs, build, grid=(2, 1, 1), loops=1, dimx=4, dtype=None):
    """A graph with one customized op: ``inputs`` are (dims, imap, fdim) or
    (dims, imap, fdim, strides); ``build(tb, tiles)`` returns [(value, omap, fdim), ...]."""
    import mugraph

    dtype = dtype or mugraph.float16
    g = mugraph.new_kernel_graph()
    ds = [g.new_input(spec[0], strides=spec[3] if len(spec) > 3 else None, dtype=dtype)
          for spec in inputs]
    tb = mugraph.new_threadblock_graph(grid, (128, 1, 1), loops, dimx)
    ts = [tb.new_input(d, spec[1], spec[2]) for d, spec in zip(ds, inputs, strict=True)]
    for value, omap, fdim in build(tb, ts):
        tb.new_output(value, omap, fdim)
    for out in g.customized(ds, tb):
        g.mark_output(out)
    return g
