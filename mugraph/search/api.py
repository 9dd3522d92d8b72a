"""``KernelGraph.superoptimize``: partition into LAX subprograms when needed, search each (or
take its answer from a result cache), construct thread graphs, verify the result again.

The search space: ``config=None`` (the default) takes the preset of the program's shape class
(:func:`mugraph.search.space.classify`: attention, gemv, lora, mlp or generic), derived from
its shapes; a preset name or a SearchConfig replaces that choice, and keyword options that
name SearchConfig fields override single fields of whichever space is used. Each subprogram
of a partitioned program is classified on its own.
"""

from __future__ import annotations

import os
import warnings
from dataclasses import fields

from mugraph.ir.ops import OpKind
from mugraph.search.config import SearchConfig, default_config
from mugraph.search.driver import SearchResult, superoptimize, verify_in_parallel
from mugraph.search.fusion import construct_thread_graphs
from mugraph.search.partition import superoptimize_partitioned
from mugraph.search.verify import NotVerifiableError, check_verifiable

# Programs with more operators than this are split into subprograms searched one by one.
MAX_OPS_PER_SEARCH = 8
# Candidates tried, best estimate first, when the final verification rejects one.
FINAL_TRIES = 4
_CONFIG_FIELDS = frozenset(f.name for f in fields(SearchConfig))


def superoptimize_graph(
    program,
    config=None,
    *,
    time_limit=None,
    final_rounds: int = 32,
    max_ops_per_search: int = MAX_OPS_PER_SEARCH,
    cache=None,
    cache_lookup: bool = True,
    **options,
):
    """The best verified μGraph for ``program`` (see KernelGraph.superoptimize).

    ``cache``: None (no cache), True (the default cache directory), a directory, or a
    :class:`mugraph.cache.ResultCache`: each searched (sub)program is looked up there first
    (a hit is re-verified and returned without searching; not with ``cache_lookup=False``)
    and stored there after a search."""
    program.check()
    n_ops = sum(1 for op in program.ops if op.kind is not OpKind.INPUT)
    store = _result_cache(cache)
    try:
        check_verifiable(program)
        whole = n_ops <= max_ops_per_search
    except NotVerifiableError:
        whole = False
    if whole:
        return _optimize_one(program, config, time_limit, final_rounds, options, store,
                             lookup=cache_lookup)
    budget = time_limit if time_limit is not None else _default_time(program, config)
    results: list[SearchResult | None] = []
    chosen = []

    def optimize_part(part):
        share = budget / max(1, n_ops) * sum(1 for op in part.ops if op.kind is not OpKind.INPUT)
        best = _optimize_one(part, config, share, final_rounds, options, store, quiet=True,
                             lookup=cache_lookup)
        results.append(getattr(best, "search_result", None))
        chosen.append(best)
        return best

    stitched, parts = superoptimize_partitioned(program, optimize_part, max_ops_per_search)
    stitched.search_result = results  # one per part (None: answered by the cache)
    stitched.partitions = parts
    stitched.part_graphs = chosen  # what replaced each part
    return stitched


def _result_cache(cache):
    if cache is None or cache is False:
        return None
    from mugraph.cache import ResultCache

    if isinstance(cache, ResultCache):
        return cache
    if cache is True:
        return ResultCache()
    if isinstance(cache, (str, os.PathLike)):
        return ResultCache(cache)
    raise TypeError(f"superoptimize: cache must be None, True, a directory or a ResultCache, "
                    f"got {cache!r}")


def _default_time(program, config) -> float:
    if isinstance(config, SearchConfig):
        return config.time_limit
    return SearchConfig().time_limit


def search_config(program, config=None, time_limit=None, **options) -> SearchConfig:
    """The SearchConfig a search of ``program`` uses: ``config`` (None: the program's shape
    class, a preset name, or a SearchConfig) with the options that name its fields."""
    if isinstance(config, SearchConfig):
        cfg = config
    else:
        cfg = default_config(program, config if isinstance(config, str) else None)
    overrides = {k: v for k, v in options.items() if k in _CONFIG_FIELDS or k == "franges"}
    if time_limit is not None:
        overrides["time_limit"] = time_limit
    return cfg.with_overrides(**overrides) if overrides else cfg


def _optimize_one(program, config, time_limit, final_rounds, options, store, quiet=False,
                  lookup=True):
    cfg = search_config(program, config, time_limit, **options)
    rest = {k: v for k, v in options.items() if k not in _CONFIG_FIELDS and k != "franges"}
    if store is not None and lookup:
        hit = store.get(program, cfg)
        if hit is not None:
            return hit
    result = superoptimize(program, config=cfg, **rest)
    best = _final(program, result, final_rounds)
    if best is None:
        if not quiet:
            warnings.warn(
                "mugraph: the search found no verified μGraph better than the program; "
                f"returning it unchanged ({result.summary()})",
                stacklevel=4,
            )
        program.search_result = result
        best = program
    if store is not None:
        try:
            store.put(program, cfg, best, result)
        except OSError as error:
            warnings.warn(f"mugraph: could not store a search result in {store}: {error}",
                          stacklevel=3)
    return best


def _final(program, result: SearchResult, final_rounds: int):
    """The best candidate that passes thread-graph construction and the final verification
    (its rounds spread over the search's workers); None when none does. A candidate the
    final rounds reject (a false pass of the search's few rounds) is dropped from the
    result's candidates."""
    for candidate in list(result.candidates[:FINAL_TRIES]):
        best = construct_thread_graphs(candidate.graph)
        check = verify_in_parallel(
            best, program, result.config.delta, max_rounds=final_rounds,
            workers=result.config.worker_count,
        )
        if check.passed:
            best.search_result = result
            best.verification = check
            return best
        result.candidates.remove(candidate)
        result.log.append(f"final verification rejected candidate {candidate.hash}: {check}")
    return None
