"""Benchmarks of mugraph: the suite of ``benchmarks/SUITE.md`` (:mod:`benchmarks.suite`), its
runner (``python -m benchmarks.run``), the search over its rows (``benchmarks.search_suite``) and
older scripts timing the hand-written μGraphs and the search."""
