"""The benchmark suite of ``benchmarks/SUITE.md`` as code: every row (workload x batch
factor) with its naive mugraph program, its PyTorch function, input maker, byte and flop
counts (:mod:`.rows`, :mod:`.programs`, :mod:`.tensors`), the μGraph mugraph runs for it
(:mod:`.mugraphs`), the baselines (:mod:`.baselines`, GPU only) and the report
(:mod:`.report`). :func:`rows_table` lists all rows."""

from __future__ import annotations

from benchmarks.suite.programs import FAMILIES, Family
from benchmarks.suite.rows import ROWS, WORKLOAD_NAMES, Row, select


def rows_table(source: str = "auto") -> str:
    """A markdown table of every row: group, b, inputs, layout, the μGraph's source and
    tiles (or why there is none), bytes, flops."""
    from benchmarks.suite.mugraphs import choose
    from benchmarks.suite.report import markdown_table

    head = ["row", "group", "b", "inputs", "layout", "μGraph", "tiles / file / reason",
            "MB", "GFLOP"]
    cells = []
    for row in ROWS.values():
        choice = choose(row, source)
        moved, flops = row.counts()
        detail = choice.label if choice.source != "none" else choice.note
        if choice.source == "hand-written" and row.family.name == "qknorm_attention":
            detail += " (norms as PyTorch operators)"
        cells.append([row.name, row.group, str(row.b), row.shapes, row.layout, choice.source,
                      detail, f"{moved / 1e6:.2f}", f"{flops / 1e9:.3f}"])
    return markdown_table(head, cells)


__all__ = ["FAMILIES", "Family", "ROWS", "Row", "WORKLOAD_NAMES", "rows_table", "select"]
