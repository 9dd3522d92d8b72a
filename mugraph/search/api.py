"""``KernelGraph.superoptimize``: search, thread-graph construction, final verification."""

from __future__ import annotations

import warnings

from mugraph.search.config import SearchConfig
from mugraph.search.driver import superoptimize
from mugraph.search.fusion import construct_thread_graphs
from mugraph.search.verify import verify


def superoptimize_graph(program, config=None, *, time_limit=None, final_rounds: int = 32,
                        **options):
    preset = config if isinstance(config, str) else None
    cfg = config if isinstance(config, SearchConfig) else None
    result = superoptimize(program, config=cfg, preset=preset, time_limit=time_limit, **options)
    if result.best is None:
        warnings.warn(
            "mugraph: the search found no verified μGraph better than the program; returning it "
            f"unchanged ({result.summary()})",
            stacklevel=3,
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
