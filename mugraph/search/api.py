"""``KernelGraph.superoptimize``: partition into LAX subprograms when needed, search each,
construct thread graphs, rank the verified candidates (measured on the GPU when there is one:
:mod:`mugraph.optimize.ranking`), verify the result again."""

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
    ranking=None,
    **options,
):
    """The best verified μGraph for ``program`` (see KernelGraph.superoptimize).

    ranking: how verified candidates are ranked (:class:`mugraph.optimize.ranking.
    RankingOptions`, a dict of its fields, or a mode: "auto", "gpu", "cost"); how it went is
    kept as ``.ranking`` on the returned graph and on its ``search_result``."""
    from mugraph.optimize.ranking import ranking_options

    ranking = ranking_options(ranking)
    program.check()
    n_ops = sum(1 for op in program.ops if op.kind is not OpKind.INPUT)
    try:
        check_verifiable(program)
        whole = n_ops <= max_ops_per_search
    except NotVerifiableError:
        whole = False
    if whole:
        return _optimize_one(program, config, time_limit, final_rounds, options, ranking)
    budget = time_limit if time_limit is not None else _default_time(program, config)
    results: list[SearchResult] = []
    rankings = []

    def optimize_part(part):
        share = budget / max(1, n_ops) * sum(1 for op in part.ops if op.kind is not OpKind.INPUT)
        best = _optimize_one(part, config, share, final_rounds, options, ranking, quiet=True)
        results.append(best.search_result)
        if getattr(best, "ranking", None) is not None:
            rankings.append(best.ranking)
        return best

    stitched, parts = superoptimize_partitioned(program, optimize_part, max_ops_per_search)
    stitched.search_result = results
    stitched.partitions = parts
    if rankings:
        from mugraph.optimize.ranking import RankingResult

        stitched.ranking = RankingResult.combine(rankings)
    return stitched


def _default_time(program, config) -> float:
    if isinstance(config, SearchConfig):
        return config.time_limit
    return SearchConfig().time_limit


def _optimize_one(program, config, time_limit, final_rounds, options, ranking,
                  quiet: bool = False):
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
    best, ranked = _rank(program, result, ranking, options.get("progress"))
    result.ranking = ranked
    if best is None:
        if not quiet:
            warnings.warn(
                f"mugraph: measured on the GPU, no verified μGraph beat the program; returning "
                f"it unchanged ({ranked.summary()})",
                stacklevel=4,
            )
        program.search_result = result
        program.ranking = ranked
        return program
    check = verify(best, program, delta=result.config.delta, max_rounds=final_rounds)
    if not check.passed:  # thread graphs never change meaning; this would be a mugraph bug
        raise AssertionError(f"thread-graph construction broke equivalence: {check}")
    best.search_result = result
    best.verification = check
    best.ranking = ranked
    return best


def _rank(program, result: SearchResult, ranking, progress):
    """(the chosen μGraph with thread graphs and launch settings, or None when the program
    itself measured fastest or no candidate ran; the RankingResult)."""
    from mugraph.optimize.ranking import Entry, launch_settings, rank_graphs

    entries = [
        Entry(f"#{i}", construct_thread_graphs(c.graph), c.cost, c.hash)
        for i, c in enumerate(result.candidates)
    ]
    report = progress if callable(progress) else _stderr_printer() if progress else None
    ranked = rank_graphs(program, entries, ranking, progress=report)
    chosen = next((e for e in entries if e.label == ranked.chosen), None)
    if chosen is None:
        return None, ranked
    best = chosen.graph
    best.launch_settings = launch_settings(ranked)
    return best, ranked


def _stderr_printer():
    import sys

    return lambda line: print(line, file=sys.stderr, flush=True)
