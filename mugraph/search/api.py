"""``KernelGraph.superoptimize``: partition into LAX subprograms when needed, search each,
construct thread graphs, verify the result again."""

from __future__ import annotations

import warnings

from mugraph.ir.ops import OpKind
from mugraph.search.config import SearchConfig
from mugraph.search.driver import SearchResult, superoptimize
from mugraph.search.fusion import construct_thread_graphs
from mugraph.search.partition import superoptimize_partitioned
from mugraph.search.verify import NotVerifiableError, check_verifiable, verify

# Programs with more operators than this are split into subprograms searched one by one.
MAX_OPS_PER_SEARCH = 8


def superoptimize_graph(
    program,
    config=None,
    *,
    time_limit=None,
    final_rounds: int = 32,
    max_ops_per_search: int = MAX_OPS_PER_SEARCH,
    **options,
):
    """The best verified μGraph for ``program`` (see KernelGraph.superoptimize)."""
    program.check()
    n_ops = sum(1 for op in program.ops if op.kind is not OpKind.INPUT)
    try:
        check_verifiable(program)
        whole = n_ops <= max_ops_per_search
    except NotVerifiableError:
        whole = False
    if whole:
        return _optimize_one(program, config, time_limit, final_rounds, options)
    budget = time_limit if time_limit is not None else _default_time(program, config)
    results: list[SearchResult] = []

    def optimize_part(part):
        share = budget / max(1, n_ops) * sum(1 for op in part.ops if op.kind is not OpKind.INPUT)
        best = _optimize_one(part, config, share, final_rounds, options, quiet=True)
        results.append(best.search_result)
        return best

    stitched, parts = superoptimize_partitioned(program, optimize_part, max_ops_per_search)
    stitched.search_result = results
    stitched.partitions = parts
    return stitched


def _default_time(program, config) -> float:
    if isinstance(config, SearchConfig):
        return config.time_limit
    return SearchConfig().time_limit


def _optimize_one(program, config, time_limit, final_rounds, options, quiet: bool = False):
    preset = config if isinstance(config, str) else None
    cfg = config if isinstance(config, SearchConfig) else None
    result = superoptimize(program, config=cfg, preset=preset, time_limit=time_limit, **options)
    if result.best is None:
        if not quiet:
            warnings.warn(
                "mugraph: the search found no verified μGraph better than the program; "
                f"returning it unchanged ({result.summary()})",
                stacklevel=4,
            )
        program.search_result = result
        return program
    best = construct_thread_graphs(result.best)
    check = verify(best, program, delta=result.config.delta, max_rounds=final_rounds)
    if not check.passed:  # thread graphs never change meaning; this would be a mugraph bug
        raise AssertionError(f"thread-graph construction broke equivalence: {check}")
    best.search_result = result
    best.verification = check
    return best
