"""``KernelGraph.superoptimize``: partition into LAX subprograms when needed, search each (or
take its answer from a result cache), construct thread graphs, rank the verified candidates
(measured on the GPU when there is one: :mod:`mugraph.optimize.ranking`), verify the chosen
one again with the full rounds.

The search space: ``config=None`` (the default) takes the preset of the program's shape class
(:func:`mugraph.search.space.classify`: attention, gemv, lora, mlp, elementwise or generic),
derived from its shapes; a preset name or a SearchConfig replaces that choice, and keyword
options that name SearchConfig fields override single fields of whichever space is used. Each
subprogram of a partitioned program is classified on its own.
"""

from __future__ import annotations

import math
import os
import time
import warnings
from dataclasses import fields

import numpy as np

from mugraph.ir.ops import OpKind
from mugraph.search.config import SearchConfig, default_config
from mugraph.search.driver import (
    SearchOptionError,
    SearchResult,
    _check_search_options,
    superoptimize,
    verify_in_parallel,
)
from mugraph.search.fusion import construct_thread_graphs
from mugraph.search.partition import has_views, moves_only, superoptimize_partitioned
from mugraph.search.verify import (
    NotVerifiableError,
    VerificationResult,
    check_verifiable,
)

# Programs with more operators than this are split into subprograms searched one by one.
MAX_OPS_PER_SEARCH = 8
# float64 re-check of a stitched graph: equivalent graphs differ by rounding only
FLOAT_RECHECK_LIMIT = 1e-6
# Candidates tried, fastest first, when the final verification rejects the chosen one (a false
# pass of the search's screening rounds).
FINAL_TRIES = 4
_CONFIG_FIELDS = frozenset(f.name for f in fields(SearchConfig))


def superoptimize_graph(
    program,
    config=None,
    *,
    time_limit=None,
    final_rounds: int = 32,
    max_ops_per_search: int = MAX_OPS_PER_SEARCH,
    ranking=None,
    cache=None,
    cache_lookup: bool = True,
    cache_only: bool = False,
    **options,
):
    """The best verified μGraph for ``program`` (see KernelGraph.superoptimize).

    Whatever the way (one search, or a search per LAX subprogram stitched back together), the
    returned graph carries ``search_result`` (a :class:`SearchResult`; a split program's has
    its parts' results in ``parts``) and, when it is not the program itself, ``verification``:
    the returned graph checked against the whole program.

    ranking: how verified candidates are ranked (:class:`mugraph.optimize.ranking.
    RankingOptions`, a dict of its fields, or a mode: "auto", "gpu", "cost"); how it went is
    kept as ``.ranking`` on the returned graph and on its ``search_result``.

    cache: None (no cache), True (the default cache directory), a directory, or a
    :class:`mugraph.cache.ResultCache`: each searched (sub)program is looked up there first
    (a hit is re-verified and returned with its recorded ranking and launch settings, without
    searching; not with ``cache_lookup=False``) and stored there after a search. With
    ``cache_only=True`` nothing is searched: a (sub)program the cache has no answer for is
    kept as it is, with a warning naming it (for deployments that must not search)."""
    from mugraph.optimize.ranking import ranking_options

    ranking = ranking_options(ranking)
    program.check()
    _check_search_options(time_limit, options.get("workers"), options.get("target_cost"))
    n_ops = sum(1 for op in program.ops if op.kind is not OpKind.INPUT)
    how = _How(final_rounds, options, ranking, _result_cache(cache), cache_lookup, cache_only)
    if cache_only and how.store is None:
        raise SearchOptionError("superoptimize: cache_only=True needs a cache (cache=DIR or True)")
    try:
        check_verifiable(program)
        whole = n_ops <= max_ops_per_search and not has_views(program)
    except NotVerifiableError:
        whole = False
    if whole:
        return _optimize_one(program, config, time_limit, how)
    return _optimize_split(program, config, time_limit, max_ops_per_search, how)


class _How:
    """How each (sub)program is optimized: final rounds, driver options, ranking, cache."""

    def __init__(self, final_rounds, options, ranking, store, lookup, only) -> None:
        self.final_rounds, self.options, self.ranking = final_rounds, options, ranking
        self.store, self.lookup, self.only = store, lookup, only


def _optimize_split(program, config, time_limit, max_ops_per_search, how: _How):
    """Search each subprogram, stitch, and verify the stitched graph against the program."""
    started = time.monotonic()
    budget = time_limit if time_limit is not None else _default_time(program, config)
    n_ops = sum(1 for op in program.ops if op.kind is not OpKind.INPUT)
    results: list[SearchResult] = []
    rankings = []
    checks: list[VerificationResult] = []
    chosen = []  # what replaced each part

    def optimize_part(part):
        if moves_only(part):  # a permute: kept, the next part reads through its strides
            results.append(_kept_result(part, "moves data only: kept as it is (no search)"))
            checks.append(_identical(part))
            chosen.append(part)
            return part
        share = budget / max(1, n_ops) * sum(1 for op in part.ops if op.kind is not OpKind.INPUT)
        best = _optimize_one(part, config, share, how, quiet=True)
        results.append(getattr(best, "search_result", None) or _cached_result(part, best))
        checks.append(getattr(best, "verification", None) or _identical(part))
        if getattr(best, "ranking", None) is not None:
            rankings.append(best.ranking)
        chosen.append(best)
        return best

    stitched, parts = superoptimize_partitioned(program, optimize_part, max_ops_per_search)
    result = SearchResult.of_parts(program, results, time.monotonic() - started)
    best = program if stitched.structural_hash() == program.structural_hash() else stitched
    best.search_result = result
    best.partitions = parts
    best.part_graphs = chosen
    if best is not program:
        best.launch_settings = _stitched_launch(best, chosen)
    if rankings:
        from mugraph.optimize.ranking import RankingResult

        result.ranking = best.ranking = RankingResult.combine(rankings)
    if best is not program:
        delta = results[0].config.delta if results else 1e-9
        best.verification = verify_stitched(best, program, checks, delta, how.final_rounds)
    elif not result.interrupted:
        warnings.warn(
            "mugraph: the search found no verified μGraph better than the program; "
            f"returning it unchanged ({result.summary()})",
            stacklevel=3,
        )
    return best


def _kernel_key(op):
    return op.kind, op.attrs, op.outputs


def _stitched_launch(stitched, chosen) -> dict:
    """The launch settings the parts' rankings chose (or their cache entries recorded), moved
    to the stitched graph's operators: a customized operator gets the settings of the part
    kernel it is (same block graph and output types)."""
    from mugraph.runtime.compiled import recorded_launch

    by_kernel = {}
    for graph in chosen:
        for i, config in recorded_launch(graph).items():
            by_kernel[_kernel_key(graph.ops[i])] = config
    return {
        i: by_kernel[_kernel_key(op)]
        for i, op in enumerate(stitched.ops)
        if op.kind is OpKind.CUSTOMIZED and _kernel_key(op) in by_kernel
    }


def float_recheck(graph, program, seed: int = 0) -> float:
    """Max relative difference of ``graph`` and ``program`` on random float64 inputs, at the
    first of a few input scales where the program's outputs are finite (exp of exp overflows
    float64 quickly); inf when they disagree on which outputs are not finite."""
    from mugraph.semantics.reference import evaluate

    rng = np.random.default_rng(seed)
    base = [rng.standard_normal(t.dims) for t in program.input_types]
    for scale in (0.5, 0.125, 1 / 32, 1 / 128):
        inputs = [x * scale for x in base]
        with np.errstate(all="ignore"):
            got, want = evaluate(graph, inputs), evaluate(program, inputs)
        if all(np.isfinite(w).all() for w in want) or scale == 1 / 128:
            break
    worst = 0.0
    for a, b in zip(got, want, strict=True):
        a = np.broadcast_to(a, b.shape)
        finite = np.isfinite(b)
        if not np.array_equal(finite, np.isfinite(a)):
            return math.inf
        if finite.any():
            scale = max(float(np.max(np.abs(b[finite]))), 1e-30)
            worst = max(worst, float(np.max(np.abs(a[finite] - b[finite]))) / scale)
    return worst


def _identical(graph) -> VerificationResult:
    """The verification of a subprogram kept as it is: nothing to test."""
    return VerificationResult(True, 0, 0.0, 1e-9, "identical to the subprogram", 0, 0)


def verify_stitched(stitched, program, checks, delta: float, rounds: int) -> VerificationResult:
    """``stitched`` (each subprogram replaced by a verified equivalent) against ``program``.

    When the whole program is within what the verifier decides, this is a plain verification
    of the whole against the whole. When it is not (two exponentials on a path across a cut),
    equivalence follows from the parts' (substitution of equals: each part computes its
    subprogram's function, so the composition computes the program's) with the false-pass
    bounds added up (union bound), and the whole is re-checked on random floats (float64)."""
    try:
        return verify_in_parallel(stitched, program, delta, max_rounds=rounds)
    except NotVerifiableError as error:
        reason = str(error).splitlines()[0]
    passed = all(c.passed for c in checks)
    bounds = [c.bound for c in checks]
    bound = None if not passed or None in bounds else min(1.0, sum(bounds))
    worst = float_recheck(stitched, program)
    notes = [f"part {i}: {c}" for i, c in enumerate(checks)]
    notes.append(f"float64 re-check of the whole: max relative difference {worst:.3g}")
    if not worst <= FLOAT_RECHECK_LIMIT:
        passed, bound = False, None
    result = VerificationResult(
        passed,
        sum(c.rounds for c in checks),
        bound,
        delta,
        f"by parts: {len(checks)} subprograms each verified, substitution of equals "
        f"(the whole is outside the verifier: {reason})",
        max((c.terms for c in checks), default=0),
        max((c.degree for c in checks), default=0),
        elapsed=sum(c.elapsed for c in checks),
        failure=None if passed else f"float64 re-check differs by {worst:.3g}",
        notes=notes,
    )
    if not passed:  # the parts were verified: this would be a mugraph bug
        raise AssertionError(f"the stitched μGraph does not compute the program: {result}")
    return result


def _default_time(program, config) -> float:
    if isinstance(config, SearchConfig):
        return config.time_limit
    return SearchConfig().time_limit


def _result_cache(cache):
    """The ResultCache that ``cache`` names (None: no cache); a path that is something other
    than a folder is refused before any search (a folder that cannot be written only warns,
    after the search, whose result the caller still gets)."""
    if cache is None or cache is False:
        return None
    from mugraph.cache import ResultCache

    if isinstance(cache, ResultCache):
        store = cache
    elif cache is True:
        store = ResultCache()
    elif isinstance(cache, str | os.PathLike):
        store = ResultCache(cache)
    else:
        raise SearchOptionError(
            f"superoptimize: cache must be None, True, a directory or a ResultCache, got {cache!r}"
        )
    if store.path.exists() and not store.path.is_dir():
        raise SearchOptionError(
            f"superoptimize: cache {str(store.path)!r} is a file, not a folder; nothing was "
            "searched")
    return store


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


def _kept_result(program, why: str) -> SearchResult:
    """A search result standing for a subprogram kept without a search."""
    from mugraph.search.generator import Stats

    result = SearchResult(program, [], Stats(), SearchConfig())
    result.log.append(why)
    return result


def _cached_result(program, hit) -> SearchResult:
    """A search result standing for a cache lookup (no search ran in this call): a hit, or
    a miss (``hit`` None) under ``cache_only``."""
    from mugraph.search.generator import Stats

    result = SearchResult(program, [], Stats(), SearchConfig())
    if hit is not None:
        result.cache = "hit"
        entry = getattr(hit, "cache_entry", None) or {}
        result.log.append(f"answered by the result cache: {entry.get('path')}")
    return result


def _optimize_one(program, config, time_limit, how: _How, quiet: bool = False):
    cfg = search_config(program, config, time_limit, **how.options)
    rest = {k: v for k, v in how.options.items() if k not in _CONFIG_FIELDS and k != "franges"}
    if how.store is not None and how.lookup:
        hit = how.store.get(program, cfg)
        if hit is not None:
            return hit
    if how.only:
        warnings.warn(
            f"mugraph: the result cache {how.store.path} has no answer for this program "
            f"({program.structural_hash()[:12]}, preset {cfg.preset}); cache_only=True: it is "
            "kept unoptimized",
            stacklevel=4,
        )
        result = _cached_result(program, None)
        result.cache = "miss"
        program.search_result = result
        return program
    result = superoptimize(program, config=cfg, **rest)
    best = _chosen(program, result, how, quiet)
    if how.store is not None:
        try:
            how.store.put(program, cfg, best, result)
        except OSError as error:
            warnings.warn(f"mugraph: could not store a search result in {how.store}: {error}",
                          stacklevel=3)
    return best


def _chosen(program, result: SearchResult, how: _How, quiet: bool):
    """The ranked best candidate, verified again with the full rounds (spread over the
    search's workers); the program itself when no candidate is left or it measured fastest.
    A candidate the full rounds reject (a false pass of the search's screening rounds) is
    dropped from the result's candidates and the rest ranked again."""
    for _ in range(FINAL_TRIES):
        if result.best is None:
            if not quiet:
                warnings.warn(
                    "mugraph: the search found no verified μGraph better than the program; "
                    f"returning it unchanged ({result.summary()})",
                    stacklevel=5,
                )
            program.search_result = result
            return program
        best, ranked = _rank(program, result, how.ranking, how.options.get("progress"))
        result.ranking = ranked
        if best is None:
            if not quiet:
                warnings.warn(
                    f"mugraph: measured on the GPU, no verified μGraph beat the program; "
                    f"returning it unchanged ({ranked.summary()})",
                    stacklevel=5,
                )
            program.search_result = result
            program.ranking = ranked
            return program
        check = verify_in_parallel(
            best, program, result.config.delta, max_rounds=how.final_rounds,
            workers=result.config.worker_count,
        )
        if check.passed:
            best.search_result = result
            best.verification = check
            best.ranking = ranked
            return best
        rejected = result.candidates.pop(int(ranked.chosen.lstrip("#")))
        result.log.append(f"final verification rejected candidate {rejected.hash}: {check}")
    program.search_result = result
    return program


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
