"""The pruning oracle: a saturated e-graph of the target, queried by lookup (paper §4.3)."""

from __future__ import annotations

import pickle
import warnings

import pytest

from mugraph.ir.ops import OpKind
from mugraph.search.oracle import (
    OracleAnswer,
    OracleBudgetWarning,
    SubexprOracle,
    Z3SubexprOracle,
    axiom_strategies,
)
from mugraph.semantics import abstract as ab
from mugraph.semantics.abstract import A_SUB, ABSTRACT_SEMANTICS, AXIOMS, Term

P = ab.parse_term
Q, K, V, X, Y, Z, W = (ab.var(n) for n in ("Q", "K", "V", "X", "Y", "Z", "W"))
W1, W3, A, B = (ab.var(n) for n in ("W1", "W3", "A", "B"))


def mm(a: Term, b: Term, k: int) -> Term:
    return ab.sum(k, ab.mul(a, b))


def check(oracle: SubexprOracle, kept: list[Term], pruned: list[Term]) -> None:
    assert oracle.saturation.saturated, oracle.saturation.summary()
    for term in kept:
        assert oracle.is_subexpr(term).subexpr is True, f"should keep {term}"
    for term in pruned:
        assert oracle.is_subexpr(term).subexpr is False, f"should prune {term}"


# --------------------------------------------------------------------------- X·Z + Y·Z (§4.3)

KXZ = 64


@pytest.fixture(scope="module")
def xz_yz() -> SubexprOracle:
    return SubexprOracle([ab.add(mm(X, Z, KXZ), mm(Y, Z, KXZ))])


def test_paper_example(xz_yz: SubexprOracle) -> None:
    check(
        xz_yz,
        kept=[
            ab.add(X, Y),  # (X + Y)·Z is the same program: must not be pruned
            ab.add(Y, X),
            mm(X, Z, KXZ),
            mm(ab.add(X, Y), Z, KXZ),
            mm(X, Z, 16),  # a split-K partial sum: sum(4, sum(16, ..)) = sum(64, ..)
            ab.mul(X, Z),
            X,
            Z,
        ],
        pruned=[
            ab.mul(X, Y),  # X·Y cannot contribute
            mm(X, Y, KXZ),
            mm(X, Z, 3),  # 3 does not divide 64
            mm(X, Z, 128),  # a sum over the wrong size
            ab.exp(X),
            ab.div(X, Y),
            ab.var("U"),
        ],
    )


# --------------------------------------------------------------------------- attention

S_D, S_N, SPLIT = 64, 1024, 8  # head dim d, sequence length n, FlashDecoding splits P


def attention_target() -> Term:
    """softmax(Q@K)@V, Q: [s, d], K: [d, n], V: [n, d']: exp, sum over n, div."""
    e = ab.exp(mm(Q, K, S_D))
    return ab.div(mm(e, V, S_N), ab.sum(S_N, e))


@pytest.fixture(scope="module")
def attention() -> SubexprOracle:
    return SubexprOracle([attention_target()])


def test_attention(attention: SubexprOracle) -> None:
    qk = mm(Q, K, S_D)
    e = ab.exp(qk)
    part = S_N // SPLIT
    check(
        attention,
        kept=[
            qk,
            e,
            mm(Q, K, 16),  # split-K of Q@K over d (before the exp)
            mm(e, V, S_N),
            ab.sum(S_N, e),
            attention_target(),
            # the other spelling: softmax first, then @V (Fig. 4a)
            mm(ab.div(e, ab.sum(S_N, e)), V, S_N),
            ab.div(e, ab.sum(S_N, e)),  # softmax itself
            # FlashDecoding (Fig. 4b): partial numerators and denominators per split ...
            mm(e, V, part),
            ab.sum(part, e),
            mm(e, V, part // 4),  # ... accumulated over for-loop tiles ...
            ab.sum(part // 4, e),
            # ... then summed over the P splits and divided
            ab.sum(SPLIT, mm(e, V, part)),
            ab.div(ab.sum(SPLIT, mm(e, V, part)), ab.sum(SPLIT, ab.sum(part, e))),
            # a partial numerator over the global denominator (sum-div moves the sum out)
            ab.div(mm(e, V, part), ab.sum(S_N, e)),
        ],
        pruned=[
            ab.exp(V),
            ab.exp(Q),
            mm(Q, K, S_N),  # Q@K reduces over d, not n
            ab.sum(3, e),  # a sum over a size that divides nothing
            ab.sum(2 * S_N, e),  # more than the sequence
            ab.exp(mm(Q, K, 16)),  # exp of a partial dot product
            mm(ab.exp(qk), Q, S_N),
            ab.div(ab.sum(S_N, e), mm(e, V, S_N)),  # upside down
            # The per-split softmax of the *rescaling* FlashDecoding variant: it only equals
            # the target after multiplying back by the partial denominator, i.e. with the
            # cancellation axiom that A_eq leaves out on purpose (paper §4.3).  Mirage's
            # FlashDecoding μGraph (Fig. 4b) keeps numerators and denominators apart instead.
            ab.div(mm(e, V, part), ab.sum(part, e)),
        ],
    )


def test_equivalence_to_the_target(attention: SubexprOracle) -> None:
    e = ab.exp(mm(Q, K, S_D))
    softmax_then_v = mm(ab.div(e, ab.sum(S_N, e)), V, S_N)
    assert attention.equivalent_to_target(softmax_then_v).subexpr is True
    split = ab.div(ab.sum(SPLIT, mm(e, V, S_N // SPLIT)), ab.sum(S_N, e))
    assert attention.equivalent_to_target(split).subexpr is True
    assert attention.equivalent_to_target(mm(e, V, S_N)).subexpr is False  # a subexpression only
    assert attention.equivalent_to_target(ab.exp(V)).subexpr is False


def test_unnormalised_nested_sum_is_found(attention: SubexprOracle) -> None:
    """sum(P, sum(n/P, x)) built without the constructors' normalisation: the e-graph's own
    sum-sum rule (and factorisation seeding) still finds it."""
    e = ab.exp(mm(Q, K, S_D))
    inner = mm(e, V, S_N // SPLIT)
    raw = ab._make("sum", (inner,), SPLIT)
    assert raw is not ab.sum(SPLIT, inner)
    assert attention.is_subexpr(raw).subexpr is True


def test_max_split(attention: SubexprOracle) -> None:
    """Online-softmax style max: a split max is found inside a whole max (max-max)."""
    s = mm(Q, K, S_D)
    safe = ab.exp(ab.sub(s, ab.max(S_N, s)))
    oracle = SubexprOracle([ab.div(mm(safe, V, S_N), ab.sum(S_N, safe))])
    check(
        oracle,
        kept=[ab.max(S_N, s), ab.max(S_N // SPLIT, s), ab.max(SPLIT, ab.max(S_N // SPLIT, s))],
        pruned=[ab.max(S_N, ab.exp(s)), ab.exp(ab.sub(s, ab.max(16, s))), ab.max(3, s)],
    )


# --------------------------------------------------------------------------- RMSNorm + Linear

K_RMS = 1024


def test_rmsnorm_linear() -> None:
    """rms_norm(X) @ W (the 1/k of the mean abstracted away) and its fused form."""
    target = mm(ab.rms_norm(K_RMS, X), W, K_RMS)
    norm = ab.sqrt(mm(X, X, K_RMS))
    fused = ab.div(mm(X, W, K_RMS), norm)
    oracle = SubexprOracle([target])
    check(
        oracle,
        kept=[
            fused,
            mm(X, W, K_RMS),
            norm,
            mm(X, X, K_RMS),
            ab.square(X),
            mm(X, W, K_RMS // 8),  # for-loop tiles of the matmul ...
            mm(X, X, K_RMS // 8),  # ... and of the sum of squares
            ab.rms(K_RMS, X),  # forloop_accum(acc="rms") over all tiles
            ab.rms_norm(K_RMS, X),
            ab.div(mm(X, W, K_RMS // 8), norm),  # a partial product, normalised
        ],
        pruned=[
            ab.sqrt(mm(X, X, K_RMS // 8)),  # the root of a partial sum of squares
            ab.mul(W, W),
            ab.exp(X),
            ab.div(norm, mm(X, W, K_RMS)),
            mm(X, W, 3),
        ],
    )


# --------------------------------------------------------------------------- gated MLP

K_MLP = 4096


def test_gated_mlp() -> None:
    g1, g3 = mm(X, W1, K_MLP), mm(X, W3, K_MLP)
    oracle = SubexprOracle([ab.mul(ab.silu(g1), g3)])
    check(
        oracle,
        kept=[
            g1,
            g3,
            ab.silu(g1),
            mm(X, W1, K_MLP // 64),  # split-K partial sums
            mm(X, W3, K_MLP // 64),
            ab.mul(X, W1),
            ab.mul(ab.silu(g1), g3),
            ab.mul(g3, ab.silu(g1)),
        ],
        pruned=[
            ab.silu(mm(X, W1, K_MLP // 64)),  # silu of a partial sum
            ab.silu(g3),  # silu on the wrong branch
            ab.mul(W1, W3),
            ab.mul(g1, g3),  # the product without the silu
            ab.gelu(g1),
            mm(X, W1, 3),
        ],
    )


# --------------------------------------------------------------------------- LoRA (§7.2)

K_LORA, R_LORA = 256, 16


def lora_target() -> Term:
    """X@W + (X@A)@B with X: [m, k], W: [k, n], A: [k, r], B: [r, n]."""
    return ab.add(mm(X, W, K_LORA), mm(mm(X, A, K_LORA), B, R_LORA))


@pytest.fixture(scope="module")
def lora() -> SubexprOracle:
    return SubexprOracle([lora_target()])


def test_lora(lora: SubexprOracle) -> None:
    xa = mm(X, A, K_LORA)
    left = ab.concat(X, xa, -1, K_LORA, R_LORA)  # X || XA  (along the reduction dim)
    right = ab.concat(W, B, -2, K_LORA, R_LORA)  # W || B
    fused = ab.matmul(left, right, K_LORA + R_LORA)  # the §7.2 operator
    assert fused is lora_target()
    check(
        lora,
        kept=[
            xa,
            mm(X, W, K_LORA),
            mm(xa, B, R_LORA),
            mm(X, A, K_LORA // 4),  # split-K of X@A
            left,  # the concat prefixes (sub-concat-operands)
            right,
            ab.add(X, xa),
            ab.add(xa, X),
            ab.concat(B, W, -2, R_LORA, K_LORA),
            fused,
            mm(X, ab.mul(A, B), K_LORA * R_LORA),  # X@(A@B): sums merge (sum-sum)
        ],
        pruned=[
            ab.mul(X, X),
            mm(W, B, K_LORA),
            ab.concat(W, W, -2, K_LORA, K_LORA),  # W is an operand of one matmul only
            ab.exp(xa),
            mm(X, A, 3),
        ],
    )


# --------------------------------------------------------------------------- Theorem 1 premise


UNARY = [OpKind.EXP, OpKind.SQRT, OpKind.SILU, OpKind.GELU, OpKind.RELU, OpKind.CLAMP]
BINARY = [OpKind.ADD, OpKind.MUL, OpKind.DIV, OpKind.SUB]


@pytest.mark.parametrize(
    ("kind", "inputs", "dims", "attrs"),
    [(kind, [X], [(8, 16)], {}) for kind in UNARY]
    + [(kind, [X, Y], [(8, 16), (8, 16)], {}) for kind in BINARY]
    + [
        (OpKind.MATMUL, [X, Y], [(8, 16), (16, 4)], {}),
        (OpKind.POW, [X], [(8, 16)], {"exponent": 3}),
        (OpKind.REDUCTION, [X], [(8, 16)], {"dim": 1}),
        (OpKind.REDUCTION_MAX, [X], [(8, 16)], {"dim": 1}),
        (OpKind.RMS_NORM, [X], [(8, 16)], {}),
        (OpKind.CONCAT, [X, Y], [(8, 16), (8, 4)], {"dim": 1}),
        (OpKind.FORLOOP_ACCUM, [X], [(8, 16)], {"forloop_range": 4, "acc": "rms"}),
        (OpKind.FORLOOP_ACCUM_MAX, [X], [(8, 16)], {"forloop_range": 4}),
        (OpKind.FORLOOP_ACCUM_RESCALE, [X, Y], [(8, 16), (8, 1)], {"forloop_range": 4}),
    ],
)
def test_inputs_are_subexpressions_of_outputs(
    kind: OpKind, inputs: list[Term], dims: list, attrs: dict
) -> None:
    """The premise of Theorem 1's proof: an operator's inputs are subexpressions of its output,
    so no prefix of a μGraph equal (under A_eq) to the target is ever pruned."""
    out = ABSTRACT_SEMANTICS[kind](inputs, dims, attrs)
    oracle = SubexprOracle([out])
    for term in inputs:
        assert oracle.is_subexpr(term).keep and oracle.is_subexpr(term).decided


# --------------------------------------------------------------------------- oracle mechanics


def test_several_targets() -> None:
    oracle = SubexprOracle([mm(X, W1, 64), ab.exp(Y)])
    check(oracle, kept=[mm(X, W1, 8), ab.exp(Y), Y], pruned=[ab.exp(X), ab.mul(X, Y)])


def test_cache_and_stats(xz_yz: SubexprOracle) -> None:
    term = mm(ab.add(X, Y), Z, 8)
    before = xz_yz.stats.cache_hits
    first = xz_yz.is_subexpr(term)
    second = xz_yz.is_subexpr(ab.parse_term(str(term)))
    assert first is second and xz_yz.stats.cache_hits == before + 1
    assert xz_yz.stats.median_uncached_s > 0.0
    assert "queries" in xz_yz.stats.summary()


def test_answers_refuse_truth_testing() -> None:
    answer = OracleAnswer(None, "budget")
    assert answer.keep and not answer.prune and not answer.decided
    with pytest.raises(TypeError):
        bool(answer)


def test_budget_exhaustion_is_reported_not_guessed() -> None:
    with pytest.warns(OracleBudgetWarning):
        oracle = SubexprOracle([attention_target()], iteration_limit=1)
    assert not oracle.saturation.saturated
    assert oracle.saturation.stop_reason == "iteration-limit"
    found = oracle.is_subexpr(mm(Q, K, S_D))  # in the target as written: still a proof
    assert found.subexpr is True
    absent = oracle.is_subexpr(ab.exp(V))
    assert absent.subexpr is None and absent.keep and not absent.decided
    assert oracle.keep(ab.exp(V)) and oracle.stats.undecided == 1


def test_node_limit() -> None:
    with pytest.warns(OracleBudgetWarning, match="node-limit"):
        oracle = SubexprOracle([lora_target()], node_limit=200)
    assert oracle.saturation.stop_reason == "node-limit"


def test_every_axiom_has_a_strategy() -> None:
    strategies = axiom_strategies()
    assert set(strategies) == {a.name for a in AXIOMS}
    assert strategies["sum-sum"] == "size-assoc"
    assert strategies["sub-concat-operands"] == "seed"
    assert strategies["sub-trans"] == "transitivity"


def test_missing_sub_axiom_is_detected() -> None:
    """Reachability may only stand for A_sub if A_sub covers every argument position."""
    axioms = [a for a in AXIOMS if a.name != "sub-div-den"]
    with pytest.raises(ValueError, match="div"):
        SubexprOracle([ab.div(X, Y)], axioms=axioms)
    assert any(a.name == "sub-div-den" for a in A_SUB)


def test_targets_must_be_ground() -> None:
    with pytest.raises(ValueError):
        SubexprOracle([ab.add(ab.pvar("x"), X)])
    with pytest.raises(ValueError):
        SubexprOracle([])


def test_oracle_pickles(xz_yz: SubexprOracle) -> None:
    copy = pickle.loads(pickle.dumps(xz_yz))
    assert copy.is_subexpr(ab.add(X, Y)).subexpr is True
    assert copy.is_subexpr(ab.mul(X, Y)).subexpr is False


# --------------------------------------------------------------------------- z3 cross-check


def test_z3_agrees_with_the_egraph() -> None:
    """Z3 (the paper's way) proves the entailed queries; on the others it may time out
    (undecided), but whenever it decides, it agrees with the e-graph."""
    target = ab.add(mm(X, Z, 8), mm(Y, Z, 8))
    egraph = SubexprOracle([target])
    solver = Z3SubexprOracle([target], timeout_ms=300)
    positives = [ab.add(X, Y), mm(ab.add(X, Y), Z, 8), mm(X, Z, 4), ab.mul(Y, Z), X, target]
    negatives = [ab.mul(X, Y), ab.exp(Z)]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for term in positives + negatives:
            ours, theirs = egraph.is_subexpr(term), solver.is_subexpr(term)
            assert ours.decided
            if theirs.decided:
                assert theirs.subexpr == ours.subexpr, term
    assert all(solver.is_subexpr(t).subexpr is True for t in positives)
    assert all(not solver.is_subexpr(t).subexpr for t in negatives)  # False or undecided


# --------------------------------------------------------------------------- hand-written μGraphs


def _block_terms(block, inputs: list[Term], seen: list[Term]) -> list[Term]:
    """Inline a block graph (paper §4.3): its inputs' expressions are the kernel inputs'."""
    values: list[Term] = []
    kernel_inputs = iter(inputs)
    outputs = []
    for op in block.ops:
        args = [values[r.op] for r in op.inputs]
        dims = [block.tensor_type(r).dims for r in op.inputs]
        if op.kind is OpKind.BLOCK_INPUT:
            args, dims = [next(kernel_inputs)], [()]
        attrs = {
            **op.attr_dict,
            "forloop_range": block.forloop_range,
            "reduction_dimx": block.reduction_dimx,
        }
        term = ABSTRACT_SEMANTICS[op.kind](args, dims, attrs)
        values.append(term)
        seen.append(term)
        if op.kind is OpKind.BLOCK_OUTPUT:
            outputs.append(term)
    return outputs


def _graph_terms(graph) -> tuple[list[Term], list[Term]]:
    """The abstract expressions of a kernel graph's outputs, and of all its tensors."""
    values: list[list[Term]] = []
    seen: list[Term] = []
    for op in graph.ops:
        if op.kind is OpKind.INPUT:
            values.append([ab.var(f"in{op.attr('index')}")])
            continue
        args = [values[r.op][r.index] for r in op.inputs]
        if op.kind is OpKind.CUSTOMIZED:
            values.append(_block_terms(op.attr("graph"), args, seen))
            continue
        dims = [graph.tensor_type(r).dims for r in op.inputs]
        values.append([ABSTRACT_SEMANTICS[op.kind](args, dims, op.attr_dict)])
        seen.append(values[-1][0])
    return [values[r.op][r.index] for r in graph.outputs], seen


def _workload_cases() -> list[tuple[str, str]]:
    from mugraph.library import WORKLOADS

    return [
        (name, label)
        for name, workload in WORKLOADS.items()
        for label in ("small", "suite", *workload.extra)
    ]


@pytest.mark.parametrize(("name", "label"), _workload_cases())
def test_hand_written_micrographs_survive_pruning(name: str, label: str) -> None:
    """Theorem 1 on the library's hand-written μGraphs (FlashDecoding, Mirage GQA, LoRA
    through concat, RMSNorm+Linear, gated MLP, adapter MLP): every tensor of the optimized
    μGraph is a subexpression of the naive program's expression, and its output is A_eq-equal
    to it, so the search cannot prune its way past them."""
    from mugraph.library import WORKLOADS

    workload = WORKLOADS[name]
    sizes = {"small": workload.small, "suite": workload.suite, **workload.extra}[label]
    (target,), _ = _graph_terms(workload.naive(sizes))
    (output,), tensors = _graph_terms(workload.optimized(sizes))
    oracle = SubexprOracle([target])
    assert oracle.saturation.saturated
    pruned = [str(t) for t in tensors if not oracle.is_subexpr(t).subexpr]
    assert not pruned
    assert oracle.equivalent_to_target(output).subexpr is True
