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
