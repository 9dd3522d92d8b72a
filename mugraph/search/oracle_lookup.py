"""The query side of the pruning oracle, in plain Python (no e-graph library).

:class:`mugraph.search.oracle.SubexprOracle` builds and saturates the target's e-graph with
egglog and exports it as tables; everything a query needs is those tables, kept by
:class:`SubexprLookup`. A pickled oracle unpickles as a ``SubexprLookup``, so search workers
(local processes, Ray tasks) answer queries without importing egglog: they start faster
(importing egglog takes seconds) and never hold an e-graph library object.
"""

from __future__ import annotations

import statistics
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from mugraph.semantics import abstract as ab
from mugraph.semantics.abstract import Term

__all__ = [
    "OracleAnswer",
    "OracleBudgetWarning",
    "OracleStats",
    "SaturationReport",
    "SubexprLookup",
]


class OracleBudgetWarning(RuntimeWarning):
    """Saturation stopped at its budget: "not found" answers are undecided, not "no"."""


@dataclass(frozen=True, slots=True)
class OracleAnswer:
    """The answer to one query.

    ``subexpr`` is True (entailed), False (not entailed: prune) or None (undecided: the budget
    ran out, keep).  Truth-testing an answer is an error on purpose: say ``.keep`` or ``.prune``.
    """

    subexpr: bool | None
    reason: str

    @property
    def decided(self) -> bool:
        return self.subexpr is not None

    @property
    def keep(self) -> bool:
        """What the search should do: keep unless proven not a subexpression."""
        return self.subexpr is not False

    @property
    def prune(self) -> bool:
        return self.subexpr is False

    def __bool__(self) -> bool:
        raise TypeError("OracleAnswer: use .keep, .prune or .subexpr (undecided is neither)")


_TIMING_SAMPLES = 1 << 16


@dataclass(slots=True)
class OracleStats:
    """Counters of an oracle; times in seconds (the last 65536 of each kind are kept)."""

    queries: int = 0
    cache_hits: int = 0
    undecided: int = 0
    uncached_seconds: deque[float] = field(default_factory=lambda: deque(maxlen=_TIMING_SAMPLES))
    cached_seconds: deque[float] = field(default_factory=lambda: deque(maxlen=_TIMING_SAMPLES))

    @property
    def uncached(self) -> int:
        """Queries answered without the answer cache."""
        return self.queries - self.cache_hits

    @property
    def median_uncached_s(self) -> float:
        return statistics.median(self.uncached_seconds) if self.uncached_seconds else 0.0

    @property
    def median_cached_s(self) -> float:
        return statistics.median(self.cached_seconds) if self.cached_seconds else 0.0

    def summary(self) -> str:
        return (
            f"{self.queries} queries, {self.cache_hits} cache hits, {self.undecided} undecided, "
            f"median uncached {self.median_uncached_s * 1e6:.1f} us, "
            f"median cached {self.median_cached_s * 1e6:.2f} us"
        )


@dataclass(frozen=True, slots=True)
class SaturationReport:
    """How the target's e-graph was built."""

    saturated: bool
    stop_reason: Literal["saturated", "node-limit", "iteration-limit", "time-limit"]
    iterations: int
    factor_rounds: int
    enodes: int
    eclasses: int
    reachable_eclasses: int
    sizes: tuple[int, ...]
    seconds: float
    export_seconds: float
    seed_seconds: float

    def summary(self) -> str:
        state = "saturated" if self.saturated else f"NOT saturated ({self.stop_reason})"
        return (
            f"{state}: {self.iterations} iterations, {self.factor_rounds} factor rounds, "
            f"{self.enodes} e-nodes, {self.eclasses} e-classes ({self.reachable_eclasses} "
            f"reachable); saturation {self.seconds * 1e3:.1f} ms, export "
            f"{self.export_seconds * 1e3:.1f} ms, seed index {self.seed_seconds * 1e3:.1f} ms"
        )


def _lower(term: Term, memo: dict[Term, Term]) -> Term:
    """Apply ``concat-as-add`` everywhere: the oracle never sees a concat head."""
    done = memo.get(term)
    if done is not None:
        return done
    if term.op == "concat":
        low = ab.add(_lower(term.args[0], memo), _lower(term.args[1], memo))
    elif term.args:
        low = ab.with_args(term, [_lower(a, memo) for a in term.args])
    else:
        low = term
    memo[term] = low
    return low


@dataclass(slots=True)
class _SeedIndex:
    """``subexpr(h(v1, .., vn), g(P1, .., Pm))`` applied lazily, at query time.

    For each argument pattern ``Pk`` of the right-hand side, ``parts[k]`` holds the positions
    (in ``h``) of the variables ``Pk`` binds and an index from their e-classes to the ids of
    the ``g`` e-nodes whose k-th child matches ``Pk`` with those bindings.  ``h(a1, .., an)`` is
    a seeded subexpression iff one ``g`` e-node is in the index of every part.
    """

    head: str
    parts: list[tuple[tuple[int, ...], dict[tuple[int, ...], set[int]]]]

    def holds(self, kids: Sequence[int]) -> bool:
        common: set[int] | None = None
        for positions, index in self.parts:
            nodes = index.get(tuple(kids[p] for p in positions))
            if not nodes:
                return False
            common = nodes if common is None else common & nodes
            if not common:
                return False
        return True


class SubexprLookup:
    """Answers ``subexpr(term, E_O)`` from a saturated e-graph's exported tables (see
    :class:`mugraph.search.oracle.SubexprOracle`, which builds them)."""

    targets: tuple[Term, ...]
    saturation: SaturationReport

    # ------------------------------------------------------------------ queries

    def is_subexpr(self, term: Term) -> OracleAnswer:
        """Is ``term`` a subexpression of (a term A_eq-equal to) one of the targets?"""
        self.stats.queries += 1
        start = time.perf_counter()
        answer = self._answers.get(term)
        if answer is not None:
            self.stats.cache_hits += 1
            self.stats.cached_seconds.append(time.perf_counter() - start)
            return answer
        if not isinstance(term, Term) or not term.ground:
            raise ValueError(f"is_subexpr: expected a ground term, got {term!r}")
        answer = self._decide(term)
        self._answers[term] = answer
        if not answer.decided:
            self.stats.undecided += 1
        self.stats.uncached_seconds.append(time.perf_counter() - start)
        return answer

    def _seeded(self, low: Term) -> bool:
        """Does a non-structural A_sub axiom (``seed``) make ``low`` a subexpression?"""
        for seed in self._seeds:
            if low.op != seed.head:
                continue
            kids = [_lookup(a, self._table, self._classes) for a in low.args]
            if None in kids or not self._reachable.issuperset(kids):
                continue
            if seed.holds(kids):  # type: ignore[arg-type]
                return True
        return False

    def keep(self, term: Term) -> bool:
        """The search's question: keep this prefix?  (Undecided answers keep it.)"""
        return self.is_subexpr(term).keep

    def equivalent_to_target(self, term: Term, index: int = 0) -> OracleAnswer:
        """Is ``term`` A_eq-equal to ``targets[index]`` (in the target's root e-class)?

        Meant for a completed μGraph's outputs (Theorem 1 covers exactly the μGraphs whose
        outputs are); not cached beyond the sub-term lookups.  Undecided when not found in the
        root e-class and saturation stopped at its budget.
        """
        if not isinstance(term, Term) or not term.ground:
            raise ValueError(f"equivalent_to_target: expected a ground term, got {term!r}")
        cls = _lookup(_lower(term, self._lowered), self._table, self._classes)
        if cls is not None and cls == self._roots[index]:
            return _EQUAL
        if self.saturation.saturated:
            return _NOT_EQUAL
        return _UNDECIDED_EQUAL

    def clear_caches(self) -> None:
        """Forget cached answers and sub-term lookups (memory); the e-graph stays."""
        self._answers.clear()
        self._classes.clear()
        self._lowered.clear()

    def _decide(self, term: Term) -> OracleAnswer:
        low = _lower(term, self._lowered)
        cls = _lookup(low, self._table, self._classes)
        if cls is not None and cls in self._reachable:
            return _FOUND
        if self._seeded(low):
            return _SEEDED
        if self.saturation.saturated:
            return _ABSENT
        return _UNDECIDED


_FOUND = OracleAnswer(True, "represented in the saturated target e-graph")
_SEEDED = OracleAnswer(True, "a seeded subexpression (non-structural A_sub axiom)")
_ABSENT = OracleAnswer(False, "not represented in the saturated target e-graph")
_UNDECIDED = OracleAnswer(None, "not represented, but saturation stopped at its budget")
_EQUAL = OracleAnswer(True, "in the target's e-class: A_eq-equal to it")
_NOT_EQUAL = OracleAnswer(False, "not in the target's e-class of the saturated e-graph")
_UNDECIDED_EQUAL = OracleAnswer(None, "not in the target's e-class, but saturation stopped early")


def _param_key(term: Term) -> Any:
    if term.op == "pow":
        return term.param or None
    return term.param


def _lookup(term: Term, table: dict[tuple, int], memo: dict[Term, int | None]) -> int | None:
    """The e-class representing ``term`` (lowered), or None; memoised per sub-term."""
    if term in memo:
        return memo[term]
    kids = []
    for arg in term.args:
        cls = _lookup(arg, table, memo)
        if cls is None:
            memo[term] = None
            return None
        kids.append(cls)
    found = table.get((term.op, _param_key(term), *kids))
    memo[term] = found
    return found


def restore_lookup(state: dict) -> SubexprLookup:
    """Unpickle an oracle as its query side (see the module docstring)."""
    lookup = SubexprLookup.__new__(SubexprLookup)
    lookup.__dict__.update(state)
    return lookup
