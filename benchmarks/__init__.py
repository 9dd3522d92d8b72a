"""Benchmarks of mugraph: the suite of ``shared/benchmarks.md`` (:mod:`benchmarks.suite`), its
runner (``python -m benchmarks.run``), the search over its rows (``benchmarks.search_suite``) and
older scripts timing the hand-written μGraphs and the search."""
