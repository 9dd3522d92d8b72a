"""The pruning oracle: is E(prefix) a subexpression of the target's abstract expression?

Paper §4.3: a μGraph prefix G is pruned unless ``A_eq ∪ A_sub ⊨ subexpr(E(G), E_O)``.  The paper
asks Z3 for every query; upstream Mirage now saturates an e-graph of the target once and looks
every query up in it.  :class:`SubexprOracle` does the latter, with the axioms read from
:data:`mugraph.semantics.abstract.AXIOMS` (data, not code):

1. **Build once.**  The target terms go into an `egglog` e-graph, which is saturated with A_eq
   (each axiom compiled to egglog rewrites, see :func:`axiom_strategies`).  The e-graph then
   holds, in the e-class of the target, every term A_eq proves equal to it (up to the budget).
2. **Sizes.**  ``sum-sum`` (``sum(i, sum(j, x)) = sum(i*j, x)``) is a rewrite left to right
   (egglog multiplies the sizes), but right to left it would have to *invent* a factorisation,
   which rewriting cannot do.  So the oracle seeds facts ``Factor(n, a, b)`` for every ``a*b = n``
   (``a, b > 1``) of every size ``n`` present in the e-graph, and a rule unions ``sum(n, x)`` with
   ``sum(a, sum(b, x))``.  Sizes that appear while saturating (products made by ``sum-sum``) are
   collected and factored in further rounds until nothing new appears.  That is what makes the
   partial sums of split-K / FlashDecoding (``sum(n/P, x)``, ``sum(P, sum(n/P, x))``) members of
   the e-graph.  The same holds for ``max`` (``max-max``).
3. **A_sub = reachability.**  Every structural axiom of A_sub says an argument of a head is a
   subexpression of the term (with commutativity, every argument position is covered: the
   oracle checks this); with reflexivity and transitivity, ``subexpr(t, E_O)`` holds iff ``t``
   is represented by an e-class reachable from the root e-class through e-node children.
   A non-structural A_sub axiom (``seed``: ``subexpr(h(x, y), rhs)``, the only one being
   ``sub-concat-operands``) is applied after saturation, lazily: its ``rhs`` matches are indexed
   by the e-classes of ``x`` and ``y``, and a query ``h(a, b)`` not found in the e-graph is a
   subexpression if one match binds ``x, y`` to the e-classes of ``a, b``.  The seeded terms are
   *not* rewritten by A_eq (a restriction: adding them to the e-graph before saturating made it
   blow up, e.g. LoRA with k=720, r=12 went from 512 to 19217 e-classes and from 1.7 s to 27 s):
   a term A_eq-equal to a seed but not of the form ``h(a, b)`` is not recognised as one.
4. **Query = lookup.**  After saturation the e-graph is exported to a Python hash-cons table
   ``(head, param, child e-classes) -> e-class``; a query looks its term up bottom-up, memoised
   per interned sub-term, so a new prefix costs one dict lookup per new sub-term.  Answers are
   cached per term.

Budget.  Associativity, commutativity and distributivity with sum-size arithmetic can blow an
e-graph up, so saturation is bounded (iterations, e-nodes, seconds).  A lookup that *finds* the
term is always a proof (everything in the e-graph is entailed).  A lookup that does not find it
is a disproof only if saturation completed; otherwise the answer is **undecided**
(``OracleAnswer.decided`` is False, counted in ``stats.undecided``, and an
:class:`OracleBudgetWarning` is issued when the e-graph is built).  The search must then keep the
prefix (``answer.keep`` is True): pruning only what is proven useless preserves Theorem 1.

:class:`Z3SubexprOracle` implements the paper's way (Z3 with the same axioms, quantified) for
cross-checking.  With quantified axioms Z3 proves entailed goals but rarely answers ``sat`` for
non-entailed ones (it times out), so a timeout is an undecided answer, never a "no".

Measured (2-core CPU, ``benchmarks/bench_oracle.py``): building the e-graph of attention
(d=128, n=4096), rmsnorm+linear or a gated MLP (k=4096) takes 0.1-0.2 s, LoRA (k=4096, r=16)
about 0.5 s; an uncached query takes 3-5 us (a cached one 0.3 us).  Asking egglog itself
(``EGraph.check``) costs about 0.6 ms a query, hence the export.  Z3 needs 20-600 ms to prove
an entailed query and times out on the others, so it cannot prune at all unless timeouts are
read as "no", which Theorem 1 does not allow.

What the axioms imply for attention: the partial sums of FlashDecoding (``sum(n/P, ..)`` of
both the numerator and the denominator, summed over the P splits, then divided) are kept; a
per-split softmax ``div(sum(n/P, mul(e, V)), sum(n/P, e))`` is pruned, because recombining such
quotients needs cancellation (``div(mul(x, y), y) = x``), which A_eq leaves out on purpose.
"""

from __future__ import annotations

import json
import math
import time
import warnings
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from functools import cache
from types import ModuleType
from typing import Any, Literal

from mugraph.errors import MissingDependencyError

try:
    from egglog import (
        EGraph,
        Expr,
        RewriteOrRule,
        String,
        StringLike,
        birewrite,
        eq,
        i64,
        i64Like,
        relation,
        rewrite,
        rule,
        ruleset,
        union,
    )
    from egglog import (
        var as egg_var,
    )
except ImportError as error:  # a broken installation: egglog is one of mugraph's dependencies
    raise MissingDependencyError(
        "the search's abstract-expression oracle needs the e-graph library egglog, which "
        f"cannot be imported ({error}); it is one of mugraph's dependencies: "
        "pip install 'egglog>=10'"
    ) from error

from mugraph.search.oracle_lookup import (
    OracleAnswer,
    OracleBudgetWarning,
    OracleStats,
    SaturationReport,
    SubexprLookup,
    _lookup,
    _lower,
    _SeedIndex,
    restore_lookup,
)
from mugraph.semantics import abstract as ab
from mugraph.semantics.abstract import AXIOMS, Axiom, SizeMul, SizeVar, Term

__all__ = [
    "OracleAnswer",
    "OracleBudgetWarning",
    "OracleStats",
    "SaturationReport",
    "SubexprOracle",
    "Z3SubexprOracle",
    "axiom_strategies",
]


# =========================================================================== answers and stats


# =========================================================================== egglog language


class AbsExpr(Expr):
    """Abstract expressions inside egglog (one constructor per head; concat becomes add)."""

    @classmethod
    def var(cls, name: StringLike) -> AbsExpr: ...

    @classmethod
    def add(cls, a: AbsExpr, b: AbsExpr) -> AbsExpr: ...

    @classmethod
    def mul(cls, a: AbsExpr, b: AbsExpr) -> AbsExpr: ...

    @classmethod
    def div(cls, a: AbsExpr, b: AbsExpr) -> AbsExpr: ...

    @classmethod
    def exp(cls, a: AbsExpr) -> AbsExpr: ...

    @classmethod
    def sqrt(cls, a: AbsExpr) -> AbsExpr: ...

    @classmethod
    def silu(cls, a: AbsExpr) -> AbsExpr: ...

    @classmethod
    def gelu(cls, a: AbsExpr) -> AbsExpr: ...

    @classmethod
    def relu(cls, a: AbsExpr) -> AbsExpr: ...

    @classmethod
    def clamp(cls, a: AbsExpr) -> AbsExpr: ...

    @classmethod
    def pow(cls, exponent: StringLike, a: AbsExpr) -> AbsExpr: ...

    @classmethod
    def sum(cls, k: i64Like, a: AbsExpr) -> AbsExpr: ...

    @classmethod
    def max(cls, k: i64Like, a: AbsExpr) -> AbsExpr: ...


_Factor = relation("MugraphFactor", i64, i64, i64)

# Heads that exist in the e-graph (concat is lowered to add: axiom concat-as-add).
_EGG_HEADS = ("var", "add", "mul", "div", "exp", "sqrt", "silu", "gelu", "relu", "clamp",
              "pow", "sum", "max")  # fmt: skip
_SIZED = ("sum", "max")


class _EggTranslator:
    """Terms (ground or patterns) to egglog expressions."""

    def __init__(self) -> None:
        self._vars: dict[tuple[str, str], Any] = {}
        self._memo: dict[Term, Any] = {}

    def _pattern_var(self, name: str, sort: type) -> Any:
        key = (name, sort.__name__)
        found = self._vars.get(key)
        if found is None:
            found = self._vars[key] = egg_var(f"{sort.__name__}_{name}", sort)
        return found

    def size(self, size: int | SizeVar | SizeMul) -> Any:
        if isinstance(size, SizeVar):
            return self._pattern_var(size.name, i64)
        if isinstance(size, SizeMul):
            return self.size(size.left) * self.size(size.right)
        return size

    def exponent(self, text: str | SizeVar | None) -> Any:
        if isinstance(text, SizeVar):
            return self._pattern_var(text.name, String)
        return text or ""

    def __call__(self, term: Term) -> Any:
        done = self._memo.get(term)
        if done is not None:
            return done
        op = term.op
        if op == "?":
            out = self._pattern_var(str(term.param), AbsExpr)
        elif op == "var":
            out = AbsExpr.var(str(term.param))
        elif op in _SIZED:
            out = getattr(AbsExpr, op)(self.size(term.param), self(term.args[0]))  # type: ignore[arg-type]
        elif op == "pow":
            out = AbsExpr.pow(self.exponent(term.param), self(term.args[0]))  # type: ignore[arg-type]
        elif op == "concat":
            raise ValueError("concat must be lowered to add before translation")
        else:
            out = getattr(AbsExpr, op)(*(self(a) for a in term.args))
        self._memo[term] = out
        return out


# =========================================================================== axioms -> strategy

Strategy = Literal[
    "birewrite",  # both directions instantiable: egglog birewrite
    "rewrite",  # one direction only (the other side has extra variables)
    "identity",  # x = f(1, x): rewrite f(1, x) -> x (constructors never build f(1, x))
    "size-assoc",  # f(i, f(j, x)) = f(i*j, x): rewrite + factorisation seeding
    "translation",  # holds by the lowering concat -> add
    "structural",  # subexpr(arg, f(.., arg, ..)): reachability through e-node children
    "reflexivity",  # reachability from the root includes the root
    "transitivity",  # reachability is transitive
    "seed",  # subexpr(t, rhs), t compound: t's instances added as roots after saturation
]


def _pattern_vars(term: Term) -> set[str]:
    return {t.param for t in ab.subterms(term) if t.op == "?"}  # type: ignore[misc]


def _has_size_product(term: Term) -> bool:
    return any(isinstance(t.param, SizeMul) for t in ab.subterms(term))


def _is_size_assoc(lhs: Term, rhs: Term) -> bool:
    """``f(i, f(j, x)) = f(i*j, x)`` for a sized head f."""
    if lhs.op not in _SIZED or rhs.op != lhs.op or not isinstance(rhs.param, SizeMul):
        return False
    inner = lhs.args[0]
    return (
        inner.op == lhs.op
        and inner.args[0] is rhs.args[0]
        and rhs.args[0].op == "?"
        and rhs.param == SizeMul(lhs.param, inner.param)  # type: ignore[arg-type]
    )


def _classify(axiom: Axiom, memo: dict[Term, Term]) -> Strategy:
    lhs, rhs = _lower(axiom.lhs, memo), _lower(axiom.rhs, memo)
    if axiom.kind == "eq":
        if lhs is rhs:
            return "translation"
        if lhs.op == "?" or rhs.op == "?":
            return "identity"
        if _has_size_product(lhs) or _has_size_product(rhs):
            if _is_size_assoc(lhs, rhs):
                return "size-assoc"
            raise ValueError(f"axiom {axiom.name}: unsupported size arithmetic")
        if _pattern_vars(lhs) == _pattern_vars(rhs):
            return "birewrite"
        return "rewrite"
    if axiom.premises:
        (a, b), (c, d) = axiom.premises
        if b is c and a is lhs and d is rhs and len(axiom.premises) == 2:
            return "transitivity"
        raise ValueError(f"axiom {axiom.name}: unsupported premises")
    if lhs is rhs:
        return "reflexivity"
    if lhs.op == "?" and any(arg is lhs for arg in rhs.args):
        return "structural"
    if lhs.op != "?" and _pattern_vars(lhs) <= _pattern_vars(rhs):
        return "seed"
    raise ValueError(f"axiom {axiom.name}: cannot be applied by the e-graph oracle")


def axiom_strategies(axioms: Sequence[Axiom] = AXIOMS) -> dict[str, Strategy]:
    """How the e-graph oracle applies each axiom (raises on an axiom it cannot apply)."""
    memo: dict[Term, Term] = {}
    return {axiom.name: _classify(axiom, memo) for axiom in axioms}


def _check_coverage(axioms: Sequence[Axiom], strategies: dict[str, Strategy]) -> None:
    """Reachability treats every argument as a subexpression: A_sub must say so too.

    Every argument position of every head must be covered by a structural axiom, directly or
    through a commutativity axiom ``f(x, y) = f(y, x)`` of A_eq.
    """
    memo: dict[Term, Term] = {}
    covered: set[tuple[str, int]] = set()
    commutative: set[str] = set()
    for axiom in axioms:
        lhs, rhs = _lower(axiom.lhs, memo), _lower(axiom.rhs, memo)
        strategy = strategies[axiom.name]
        if strategy == "structural":
            covered.update((rhs.op, i) for i, arg in enumerate(rhs.args) if arg is lhs)
        elif strategy == "birewrite" and lhs.op == rhs.op and len(lhs.args) == 2:
            if lhs.args == rhs.args[::-1] and lhs.args[0] is not lhs.args[1]:
                commutative.add(lhs.op)
    for head in commutative:
        if (head, 0) in covered or (head, 1) in covered:
            covered.update({(head, 0), (head, 1)})
    missing = [
        (head, i)
        for head in _EGG_HEADS
        for i in range(ab.HEADS[head].arity)
        if (head, i) not in covered
    ]
    if missing:
        raise ValueError(
            f"A_sub does not cover argument positions {missing}: reachability "
            "would over-approximate the subexpression relation"
        )


def _compile_rules(
    axioms: Sequence[Axiom], strategies: dict[str, Strategy]
) -> tuple[list[RewriteOrRule], set[str]]:
    """egglog rules for the axioms, and the heads that need factorisation seeding."""
    translate = _EggTranslator()
    memo: dict[Term, Term] = {}
    rules: list[RewriteOrRule] = []
    factor_heads: set[str] = set()
    for axiom in axioms:
        strategy = strategies[axiom.name]
        lhs, rhs = _lower(axiom.lhs, memo), _lower(axiom.rhs, memo)
        if strategy == "birewrite":
            rules.append(birewrite(translate(lhs)).to(translate(rhs)))
        elif strategy == "rewrite":
            big, small = (lhs, rhs) if _pattern_vars(rhs) <= _pattern_vars(lhs) else (rhs, lhs)
            rules.append(rewrite(translate(big)).to(translate(small)))
        elif strategy == "identity":
            compound, bare = (rhs, lhs) if lhs.op == "?" else (lhs, rhs)
            rules.append(rewrite(translate(compound)).to(translate(bare)))
        elif strategy == "size-assoc":
            rules.append(rewrite(translate(lhs)).to(translate(rhs)))
            rules.append(_factor_rule(lhs.op, translate))
            factor_heads.add(lhs.op)
    return rules, factor_heads


def _factor_rule(head: str, translate: _EggTranslator) -> RewriteOrRule:
    """``Factor(n, a, b)`` and ``f(n, x)`` give ``f(n, x) = f(a, f(b, x))``."""
    build = getattr(AbsExpr, head)
    n, a, b = (
        translate.size(SizeVar("fn")),
        translate.size(SizeVar("fa")),
        translate.size(SizeVar("fb")),
    )
    x = translate(ab.pvar("fx"))
    t = translate(ab.pvar("ft"))
    return rule(eq(t).to(build(n, x)), _Factor(n, a, b)).then(union(t).with_(build(a, build(b, x))))


def _factor_pairs(n: int) -> list[tuple[int, int]]:
    pairs = []
    for a in range(2, math.isqrt(n) + 1):
        if n % a == 0:
            pairs.append((a, n // a))
            if a != n // a:
                pairs.append((n // a, a))
    return pairs


# =========================================================================== the exported graph


@dataclass(slots=True)
class _Exported:
    """The saturated e-graph as Python data: e-nodes are keys ``(head, param, *kid_classes)``."""

    table: dict[tuple, int]
    by_class: dict[int, list[tuple]]
    by_head: dict[str, list[tuple]]
    sizes: set[int]
    eclasses: int

    def children(self) -> dict[int, set[int]]:
        return {cls: {k for key in keys for k in key[2:]} for cls, keys in self.by_class.items()}


def _export(egraph: EGraph) -> _Exported:
    serialized = egraph._serialize(
        max_functions=None,
        max_calls_per_function=None,
        n_inline_leaves=0,
        split_primitive_outputs=False,
    )
    if serialized.truncated_functions or serialized.discarded_functions:
        raise RuntimeError("egglog truncated the serialized e-graph")
    nodes: dict[str, dict[str, Any]] = json.loads(serialized.to_json())["nodes"]
    class_ids: dict[str, int] = {}
    exported = _Exported({}, {}, {}, set(), 0)

    def class_of(node_id: str) -> int:
        return class_ids.setdefault(nodes[node_id]["eclass"], len(class_ids))

    for node in nodes.values():
        op: str = node["op"]
        if not op.startswith("AbsExpr."):
            continue  # primitives and the Factor relation
        head = op[len("AbsExpr.") :]
        kids = node["children"]
        param: Any = None
        if head in _SIZED:
            param = int(nodes[kids[0]]["op"])
            exported.sizes.add(param)
            kids = kids[1:]
        elif head in ("var", "pow"):
            text = json.loads(nodes[kids[0]]["op"])
            param = text if head == "var" else (text or None)
            kids = kids[1:]
        key = (head, param, *(class_of(k) for k in kids))
        own = class_ids.setdefault(node["eclass"], len(class_ids))
        exported.table[key] = own
        exported.by_class.setdefault(own, []).append(key)
        exported.by_head.setdefault(head, []).append(key)
    exported.eclasses = len(exported.by_class)
    return exported


# ---------------------------------------------------------------------- e-matching (for seeds)

Subst = dict[Any, Any]


def _match_param(pattern: Any, value: Any, subst: Subst) -> Subst | None:
    if isinstance(pattern, SizeVar):
        bound = subst.get(("size", pattern.name))
        if bound is None:
            return {**subst, ("size", pattern.name): value}
        return subst if bound == value else None
    return subst if pattern == value else None


def _match(pattern: Term, cls: int, subst: Subst, graph: _Exported) -> Iterator[Subst]:
    """All extensions of ``subst`` matching ``pattern`` against e-class ``cls``."""
    if pattern.op == "?":
        bound = subst.get(pattern.param)
        if bound is None:
            yield {**subst, pattern.param: cls}
        elif bound == cls:
            yield subst
        return
    for key in graph.by_class.get(cls, ()):
        if key[0] == pattern.op:
            yield from _match_node(pattern, key, subst, graph)


def _match_node(pattern: Term, key: tuple, subst: Subst, graph: _Exported) -> Iterator[Subst]:
    first = _match_param(pattern.param, key[1], subst)
    if first is None:
        return
    partial = [first]
    for arg, cls in zip(pattern.args, key[2:], strict=True):
        partial = [s for p in partial for s in _match(arg, cls, p, graph)]
    yield from partial


def _seed_index(lhs: Term, rhs: Term, graph: _Exported) -> _SeedIndex:
    """Index the matches of ``rhs`` in the saturated e-graph, projected on ``lhs``'s variables.

    Supported shape (raises otherwise): ``lhs`` is a head over distinct pattern variables and
    the arguments of ``rhs`` bind disjoint sets of variables.
    """
    names = [a.param for a in lhs.args]
    if any(a.op != "?" for a in lhs.args) or len(set(names)) != len(names) or lhs.param:
        raise ValueError(f"seed {lhs}: the left-hand side must be a head over distinct variables")
    arg_vars = [_pattern_vars(p) for p in rhs.args]
    if any(arg_vars[i] & arg_vars[j] for i in range(len(arg_vars)) for j in range(i)):
        raise ValueError(f"seed {rhs}: the arguments must bind disjoint variables")
    parts = []
    for pattern, bound in zip(rhs.args, arg_vars, strict=True):
        positions = tuple(i for i, name in enumerate(names) if name in bound)
        parts.append((pattern, positions, {}))
    projections: dict[tuple[int, int], set[tuple[int, ...]]] = {}
    for node_id, key in enumerate(graph.by_head.get(rhs.op, ())):
        if _match_param(rhs.param, key[1], {}) is None:
            continue
        for k, ((pattern, positions, index), cls) in enumerate(zip(parts, key[2:], strict=True)):
            found = projections.get((k, cls))
            if found is None:
                found = projections[(k, cls)] = {
                    tuple(subst[names[p]] for p in positions)
                    for subst in _match(pattern, cls, {}, graph)
                }
            for binding in found:
                index.setdefault(binding, set()).add(node_id)
    return _SeedIndex(lhs.op, [(positions, index) for _, positions, index in parts])


def _reachable(roots: Iterable[int], children: dict[int, set[int]]) -> set[int]:
    seen = set(roots)
    stack = list(seen)
    while stack:
        for kid in children.get(stack.pop(), ()):
            if kid not in seen:
                seen.add(kid)
                stack.append(kid)
    return seen


# =========================================================================== the oracle


def _sizes_of(terms: Iterable[Term]) -> set[int]:
    return {
        t.param
        for term in terms
        for t in ab.subterms(term)
        if t.op in _SIZED and isinstance(t.param, int)
    }


class SubexprOracle(SubexprLookup):
    """Answers ``subexpr(term, E_O)`` for the target terms ``E_O`` (any of them).

    The target e-graph is built and saturated once, in the constructor (see the module
    docstring); ``saturation`` reports how.  Budget: ``node_limit`` e-nodes (tuples in the
    e-graph), ``iteration_limit`` rule applications, ``time_limit_s`` seconds.
    """

    def __init__(
        self,
        target_terms: Sequence[Term],
        *,
        axioms: Sequence[Axiom] = AXIOMS,
        node_limit: int = 200_000,
        iteration_limit: int = 200,
        time_limit_s: float = 30.0,
    ) -> None:
        if not target_terms:
            raise ValueError("SubexprOracle: at least one target term is required")
        for term in target_terms:
            if not isinstance(term, Term) or not term.ground:
                raise ValueError(f"SubexprOracle: targets must be ground terms, got {term!r}")
        self.targets: tuple[Term, ...] = tuple(target_terms)
        self.strategies = axiom_strategies(axioms)
        _check_coverage(axioms, self.strategies)
        self._lowered: dict[Term, Term] = {}
        self._limits = (node_limit, iteration_limit, time_limit_s)
        self.saturation: SaturationReport
        self._table: dict[tuple, int]
        self._reachable: set[int]
        self._build(axioms)
        self._classes: dict[Term, int | None] = {}
        self._answers: dict[Term, OracleAnswer] = {}
        self.stats = OracleStats()
        if not self.saturation.saturated:
            warnings.warn(
                OracleBudgetWarning(
                    f"SubexprOracle: {self.saturation.summary()}; queries not found are "
                    "undecided (keep the prefix)"
                ),
                stacklevel=2,
            )

    def __reduce__(self):
        # a copy is the query side only: unpickling needs no egglog (see oracle_lookup)
        return (restore_lookup, (dict(self.__dict__),))

    # ------------------------------------------------------------------ building

    def _build(self, axioms: Sequence[Axiom]) -> None:
        egraph = EGraph()
        try:
            self._saturate_and_export(egraph, axioms)
        finally:
            _release(egraph)

    def _saturate_and_export(self, egraph: EGraph, axioms: Sequence[Axiom]) -> None:
        rules, factor_heads = _compile_rules(axioms, self.strategies)
        rules_set = ruleset(*rules)
        translate = _EggTranslator()
        lowered = [_lower(t, self._lowered) for t in self.targets]
        for term in lowered:
            egraph.register(translate(term))
        start = time.perf_counter()
        factored: set[int] = set()
        pending = _sizes_of(lowered) if factor_heads else set()
        iterations = rounds = 0
        export_seconds = 0.0
        while True:
            if pending:
                rounds += 1
                for n in sorted(pending):
                    for a, b in _factor_pairs(n):
                        egraph.register(_Factor(n, a, b))
                factored |= pending
            stop, iterations = self._run(egraph, rules_set, start, iterations)
            export_start = time.perf_counter()
            exported = _export(egraph)
            export_seconds += time.perf_counter() - export_start
            if stop != "saturated":
                break
            pending = (exported.sizes - factored) if factor_heads else set()
            if not pending:
                break
        seconds = time.perf_counter() - start - export_seconds
        memo: dict[Term, int | None] = {}
        roots = {_lookup(t, exported.table, memo) for t in lowered}
        if None in roots:  # pragma: no cover - a target is always in its own e-graph
            raise RuntimeError("a target term is missing from its own e-graph")
        seed_start = time.perf_counter()
        reachable = _reachable(roots, exported.children())  # type: ignore[arg-type]
        self._seeds = [
            _seed_index(_lower(a.lhs, self._lowered), _lower(a.rhs, self._lowered), exported)
            for a in axioms
            if self.strategies[a.name] == "seed"
        ]
        seed_seconds = time.perf_counter() - seed_start
        self._table = exported.table
        self._reachable = reachable
        self._roots: tuple[int, ...] = tuple(memo[t] for t in lowered)  # type: ignore[misc]
        self.saturation = SaturationReport(
            saturated=stop == "saturated",
            stop_reason=stop,  # type: ignore[arg-type]
            iterations=iterations,
            factor_rounds=rounds,
            enodes=len(exported.table),
            eclasses=exported.eclasses,
            reachable_eclasses=len(reachable),
            sizes=tuple(sorted(exported.sizes)),
            seconds=seconds,
            export_seconds=export_seconds,
            seed_seconds=seed_seconds,
        )

    def _run(
        self, egraph: EGraph, rules_set: Any, start: float, iterations: int
    ) -> tuple[str, int]:
        """Apply the rules until fixpoint or budget; returns (stop reason, iterations)."""
        node_limit, iteration_limit, time_limit_s = self._limits
        while True:
            if iterations >= iteration_limit:
                return "iteration-limit", iterations
            if time.perf_counter() - start > time_limit_s:
                return "time-limit", iterations
            report = egraph.run(1, ruleset=rules_set)
            iterations += 1
            if _count_tuples(egraph) > node_limit:
                return "node-limit", iterations
            if not report.updated:
                return "saturated", iterations


def _release(egraph: EGraph) -> None:
    """Free the Rust e-graph now, on this thread.

    egglog's ``EGraph.run`` leaves its state in a reference cycle (a recursive closure of
    ``EGraphState._process_schedule`` holds the state), so without this the e-graph is freed
    by the cyclic garbage collector at some later time, in whatever thread or process runs
    it. Freed in a forked child, its teardown broadcasts to rayon threads that exist only in
    the parent and waits forever (the search hangs); freed in another thread of this process,
    pyo3 refuses ("unsendable, but is being dropped on another thread"). The oracle keeps only
    the exported tables, so the e-graph can go as soon as they are built."""
    states = [getattr(egraph, "_state", None), *getattr(egraph, "_state_stack", ())]
    for state in states:
        if state is not None and hasattr(state, "egraph"):
            state.egraph = None  # the last reference: the Rust e-graph is dropped here


def _count_tuples(egraph: EGraph) -> int:
    """Number of tuples (e-nodes and relation facts) in an egglog e-graph."""
    total = 0
    for _, count in egraph.all_function_sizes():
        total += count
    return total


# =========================================================================== z3 (the paper's way)


@cache
def _z3() -> ModuleType:
    """z3, imported on first use (only the cross-checking oracle needs it)."""
    try:
        import z3
    except ImportError as error:  # a broken installation: z3-solver is a dependency
        raise MissingDependencyError(
            "the cross-checking oracle (Z3SubexprOracle) needs the SMT solver z3, which cannot "
            f"be imported ({error}); it is one of mugraph's dependencies: "
            "pip install 'z3-solver>=4.12'"
        ) from error
    return z3


class Z3SubexprOracle:
    """The paper's oracle: Z3 with the axioms of :data:`AXIOMS` as quantified formulas.

    Factorisations cannot be found by E-matching either, so the same ``sum(n, x) =
    sum(a, sum(b, x))`` instances are asserted for the sizes of the target and of each query.
    ``unsat`` of the negated goal proves the subexpression; ``sat`` disproves it; ``unknown``
    (typically a timeout: quantified axioms rarely give ``sat``) is undecided.
    """

    def __init__(
        self, target_terms: Sequence[Term], *, axioms: Sequence[Axiom] = AXIOMS,
        timeout_ms: int = 1000,
    ) -> None:  # fmt: skip
        self.targets = tuple(target_terms)
        self.timeout_ms = timeout_ms
        self._exponents: dict[Any, int] = {}
        self._sort = _z3().DeclareSort("AbsExpr")
        self._funcs = self._declare()
        self._subexpr = _z3().Function("subexpr", self._sort, self._sort, _z3().BoolSort())
        self._lowered: dict[Term, Term] = {}
        self._solver = _z3().Solver()
        self._solver.set("timeout", timeout_ms)
        for axiom in axioms:
            formula = self._axiom(axiom)
            if formula is not None:
                self._solver.add(formula)
        self._factored: set[tuple[str, int]] = set()
        self._target_z3 = [self._ground(t) for t in self.targets]
        self._add_factorisations(self.targets)
        self._answers: dict[Term, OracleAnswer] = {}
        self.stats = OracleStats()

    def _declare(self) -> dict[str, Any]:
        s, i = self._sort, _z3().IntSort()
        funcs = {op: _z3().Function(op, s, s, s) for op in ("add", "mul", "div")}
        funcs.update({op: _z3().Function(op, s, s) for op in ("exp", "sqrt", "silu", "gelu",
                                                           "relu", "clamp")})  # fmt: skip
        funcs.update({op: _z3().Function(op, i, s, s) for op in ("sum", "max", "pow")})
        return funcs

    def _exponent(self, text: Any) -> Any:
        """Exponents are constants of the theory: number them."""
        return _z3().IntVal(self._exponents.setdefault(text, len(self._exponents)))

    def _build(self, term: Term, env: dict[str, Any]) -> Any:
        op = term.op
        if op == "?":
            return env[term.param]  # type: ignore[index]
        if op == "var":
            return _z3().Const(f"in!{term.param}", self._sort)
        args = [self._build(a, env) for a in term.args]
        if op in _SIZED:
            return self._funcs[op](self._size(term.param, env), *args)
        if op == "pow":
            param = term.param
            exponent = env[param.name] if isinstance(param, SizeVar) else self._exponent(param)
            return self._funcs["pow"](exponent, *args)
        return self._funcs[op](*args)

    def _size(self, size: Any, env: dict[str, Any]) -> Any:
        if isinstance(size, SizeVar):
            return env[size.name]
        if isinstance(size, SizeMul):
            return self._size(size.left, env) * self._size(size.right, env)
        return _z3().IntVal(size)

    def _ground(self, term: Term) -> Any:
        return self._build(_lower(term, self._lowered), {})

    def _axiom(self, axiom: Axiom) -> Any:
        lhs, rhs = _lower(axiom.lhs, self._lowered), _lower(axiom.rhs, self._lowered)
        if axiom.kind == "eq" and lhs is rhs:
            return None  # concat-as-add: applied by lowering
        env: dict[str, Any] = {}
        for term in (lhs, rhs, *(t for pair in axiom.premises for t in pair)):
            for sub in ab.subterms(term):
                if sub.op == "?":
                    env.setdefault(sub.param, _z3().Const(f"p!{sub.param}", self._sort))
                for size in _size_vars(sub.param):
                    env.setdefault(size, _z3().Int(f"s!{size}"))
        left, right = self._build(lhs, env), self._build(rhs, env)
        bound = list(env.values())
        if axiom.kind == "eq":
            patterns = [p for p, t in ((left, lhs), (right, rhs)) if _good_trigger(t, env)]
            return _z3().ForAll(bound, left == right, patterns=patterns)
        goal = self._subexpr(left, right)
        if axiom.premises:
            facts = [self._subexpr(self._build(a, env), self._build(b, env))
                     for a, b in axiom.premises]  # fmt: skip
            return _z3().ForAll(bound, _z3().Implies(_z3().And(*facts), goal),
                             patterns=[_z3().MultiPattern(*facts)])  # fmt: skip
        if lhs is rhs:
            return _z3().ForAll(bound, goal, patterns=[goal])
        return _z3().ForAll(bound, goal, patterns=[right])

    def _add_factorisations(self, terms: Iterable[Term]) -> None:
        x = _z3().Const("p!fx", self._sort)
        for term in terms:
            for sub in ab.subterms(_lower(term, self._lowered)):
                if sub.op not in _SIZED or not isinstance(sub.param, int):
                    continue
                n = sub.param
                if (sub.op, n) in self._factored:
                    continue
                self._factored.add((sub.op, n))
                f = self._funcs[sub.op]
                whole = f(_z3().IntVal(n), x)
                for a, b in _factor_pairs(n):
                    split = f(_z3().IntVal(a), f(_z3().IntVal(b), x))
                    self._solver.add(_z3().ForAll([x], whole == split, patterns=[whole, split]))

    def is_subexpr(self, term: Term) -> OracleAnswer:
        self.stats.queries += 1
        answer = self._answers.get(term)
        if answer is not None:
            self.stats.cache_hits += 1
            return answer
        start = time.perf_counter()
        self._add_factorisations([term])
        query = self._ground(term)
        self._solver.push()
        self._solver.add(_z3().Not(_z3().Or(*(self._subexpr(query, t) for t in self._target_z3))))
        result = self._solver.check()
        self._solver.pop()
        if result == _z3().unsat:
            answer = OracleAnswer(True, "z3: entailed (unsat)")
        elif result == _z3().sat:
            answer = OracleAnswer(False, "z3: not entailed (sat)")
        else:
            answer = OracleAnswer(None, f"z3: {self._solver.reason_unknown()}")
            self.stats.undecided += 1
        self._answers[term] = answer
        self.stats.uncached_seconds.append(time.perf_counter() - start)
        return answer


def _size_vars(param: Any) -> list[str]:
    if isinstance(param, SizeVar):
        return [param.name]
    if isinstance(param, SizeMul):
        return [param.left.name, param.right.name]
    if isinstance(param, tuple):
        return [name for p in param for name in _size_vars(p)]
    return []


def _good_trigger(term: Term, env: dict[str, Any]) -> bool:
    """A trigger must be compound, mention every bound variable and do no arithmetic."""
    if term.op == "?" or _has_size_product(term):
        return False
    names = _pattern_vars(term) | {n for t in ab.subterms(term) for n in _size_vars(t.param)}
    return names == set(env)
