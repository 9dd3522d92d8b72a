"""``KernelGraph.superoptimize``: partition into LAX subprograms when needed, search each,
construct thread graphs, rank the verified candidates (measured on the GPU when there is one:
:mod:`mugraph.optimize.ranking`), verify the result again."""

from __future__ import annotations

import math
import time
import warnings

import numpy as np

from mugraph.ir.ops import OpKind
from mugraph.search.config import SearchConfig
from mugraph.search.driver import (
    SearchResult,
    _check_search_options,
    superoptimize,
)
from mugraph.search.fusion import construct_thread_graphs
from mugraph.search.partition import superoptimize_partitioned
from mugraph.search.verify import (
    NotVerifiableError,
    VerificationResult,
    check_verifiable,
    verify,
)

# Programs with more operators than this are split into subprograms searched one by one.
MAX_OPS_PER_SEARCH = 8
# float64 re-check of a stitched graph: equivalent graphs differ by rounding only
FLOAT_RECHECK_LIMIT = 1e-6


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

    Whatever the way (one search, or a search per LAX subprogram stitched back together), the
    returned graph carries ``search_result`` (a :class:`SearchResult`; a split program's has
    its parts' results in ``parts``) and, when it is not the program itself, ``verification``:
    the returned graph checked against the whole program.

    ranking: how verified candidates are ranked (:class:`mugraph.optimize.ranking.
    RankingOptions`, a dict of its fields, or a mode: "auto", "gpu", "cost"); how it went is
    kept as ``.ranking`` on the returned graph and on its ``search_result``."""
    from mugraph.optimize.ranking import ranking_options

    ranking = ranking_options(ranking)
    program.check()
    _check_search_options(time_limit, options.get("workers"), options.get("target_cost"))
    n_ops = sum(1 for op in program.ops if op.kind is not OpKind.INPUT)
    try:
        check_verifiable(program)
        whole = n_ops <= max_ops_per_search
    except NotVerifiableError:
        whole = False
    if whole:
        return _optimize_one(program, config, time_limit, final_rounds, options, ranking)
    return _optimize_split(
        program, config, time_limit, final_rounds, max_ops_per_search, options, ranking
    )


def _optimize_split(program, config, time_limit, final_rounds, max_ops_per_search, options,
                    ranking):
    """Search each subprogram, stitch, and verify the stitched graph against the program."""
    started = time.monotonic()
    budget = time_limit if time_limit is not None else _default_time(program, config)
    n_ops = sum(1 for op in program.ops if op.kind is not OpKind.INPUT)
    results: list[SearchResult] = []
    rankings = []
    checks: list[VerificationResult] = []

    def optimize_part(part):
        share = budget / max(1, n_ops) * sum(1 for op in part.ops if op.kind is not OpKind.INPUT)
        best = _optimize_one(part, config, share, final_rounds, options, ranking, quiet=True)
        results.append(best.search_result)
        checks.append(getattr(best, "verification", None) or _identical(part))
        if getattr(best, "ranking", None) is not None:
            rankings.append(best.ranking)
        return best

    stitched, parts = superoptimize_partitioned(program, optimize_part, max_ops_per_search)
    result = SearchResult.of_parts(program, results, time.monotonic() - started)
    best = program if stitched.structural_hash() == program.structural_hash() else stitched
    best.search_result = result
    best.partitions = parts
    if rankings:
        from mugraph.optimize.ranking import RankingResult

        result.ranking = best.ranking = RankingResult.combine(rankings)
    if best is not program:
        delta = results[0].config.delta if results else 1e-9
        best.verification = verify_stitched(best, program, checks, delta, final_rounds)
    elif not result.interrupted:
        warnings.warn(
            "mugraph: the search found no verified μGraph better than the program; "
            f"returning it unchanged ({result.summary()})",
            stacklevel=3,
        )
    return best


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
        return verify(stitched, program, delta=delta, max_rounds=rounds)
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
