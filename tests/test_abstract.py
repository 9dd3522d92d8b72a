"""Abstract expressions: hash-consing, canonical forms, printing, axioms, Table 1 by OpKind."""

from __future__ import annotations

import pickle

import pytest

from mugraph.ir.ops import OpKind
from mugraph.semantics import abstract as ab
from mugraph.semantics.abstract import (
    A_EQ,
    A_SUB,
    ABSTRACT_SEMANTICS,
    AXIOMS,
    HEADS,
    AbstractSemanticsError,
    Term,
)

Q, K, V, X, W = (ab.var(n) for n in ("Q", "K", "V", "X", "W"))


def semantics(kind: OpKind, inputs: list[Term], dims: list[tuple[int, ...]], **attrs) -> Term:
    return ABSTRACT_SEMANTICS[kind](inputs, dims, attrs)


# --------------------------------------------------------------------------- hash-consing


def test_same_term_is_same_object() -> None:
    first = ab.sum(64, ab.mul(ab.var("Q"), ab.var("K")))
    second = ab.sum(64, ab.mul(ab.var("Q"), ab.var("K")))
    assert first is second
    assert first == second and hash(first) == hash(second)
    assert ab.sum(64, ab.mul(Q, K)) is not ab.sum(32, ab.mul(Q, K))  # k is kept
    assert ab.mul(Q, K) is not ab.mul(K, Q)  # no silent reordering: A_eq does that


def test_terms_are_immutable() -> None:
    term = ab.add(Q, K)
    with pytest.raises(AttributeError):
        term.op = "mul"  # type: ignore[misc]
    with pytest.raises(TypeError):
        Term()


def test_pickle_reinterns() -> None:
    term = ab.div(ab.sum(8, ab.mul(ab.exp(Q), V)), ab.sum(8, ab.exp(Q)))
    assert pickle.loads(pickle.dumps(term)) is term


def test_terms_key_dicts() -> None:
    cache = {ab.exp(ab.sum(64, ab.mul(Q, K))): "kept"}
    assert cache[ab.exp(ab.sum(64, ab.mul(Q, K)))] == "kept"


# --------------------------------------------------------------------------- canonical forms


def test_sum_identity_and_nesting_are_normalised() -> None:
    x = ab.mul(ab.exp(Q), V)
    assert ab.sum(1, x) is x
    assert ab.sum(4, ab.sum(256, x)) is ab.sum(1024, x)
    assert ab.max(2, ab.max(8, x)) is ab.max(16, x)
    assert ab.sum(4, ab.max(8, x)).op == "sum"  # different heads do not merge


def test_definitions() -> None:
    assert ab.square(X) is ab.mul(X, X)
    assert ab.sub(X, W) is ab.add(X, W)
    assert ab.mul_scalar(X, 0.125) is X
    assert ab.reshape(X) is X
    assert ab.pow(X, 2) is ab.mul(X, X)
    assert ab.pow(X, 0.5) is ab.sqrt(X)
    assert ab.pow(X, 1.0) is X
    assert ab.pow(X, 3) is ab.pow(X, 3.0) and ab.pow(X, 3) is not ab.pow(X, 4)
    assert ab.clamp(X, 0.0, 6.0) is ab.clamp(X)
    assert ab.rms_norm(64, X) is ab.div(X, ab.sqrt(ab.sum(64, ab.mul(X, X))))


def test_patterns_are_not_normalised() -> None:
    x = ab.pvar("x")
    assert ab.sum(1, x).op == "sum"
    i, j = ab.SizeVar("i"), ab.SizeVar("j")
    assert ab.sum(i, ab.sum(j, x)).args[0].op == "sum"
    assert not ab.sum(i, x).ground and ab.sum(3, X).ground


@pytest.mark.parametrize("bad", [0, -4, True, 2.0, "8"])
def test_sizes_are_positive_ints(bad: object) -> None:
    with pytest.raises((ValueError, TypeError)):
        ab.sum(bad, X)  # type: ignore[arg-type]


def test_constructors_reject_non_terms() -> None:
    with pytest.raises(TypeError):
        ab.add(X, "W")  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        ab.var("")


# --------------------------------------------------------------------------- printing


def test_printer() -> None:
    assert str(ab.sum(64, ab.mul(Q, K))) == "sum(64, mul(Q, K))"
    assert str(ab.div(X, ab.sqrt(ab.sum(8, ab.mul(X, X))))) == "div(X, sqrt(sum(8, mul(X, X))))"
    assert str(ab.pow(X, 3)) == "pow(X, 3)"
    assert str(ab.concat(X, W, -1, 64, 16)) == "concat(-1, 64, 16, X, W)"
    assert str(ab.sum(ab.SizeVar("i"), ab.pvar("x"))) == "sum(i, ?x)"


@pytest.mark.parametrize(
    "text",
    [
        "sum(64, mul(Q, K))",
        "div(sum(1024, mul(exp(sum(64, mul(Q, K))), V)), sum(1024, exp(sum(64, mul(Q, K)))))",
        "mul(silu(sum(4096, mul(X, W1))), sum(4096, mul(X, W3)))",
        "concat(-1, 64, 16, X, sum(64, mul(X, A)))",
        "pow(relu(X), 3)",
        "max(16, gelu(clamp(X)))",
        "sum(4, ?x)",
    ],
)
def test_parse_round_trip(text: str) -> None:
    term = ab.parse_term(text)
    assert str(term) == text
    assert ab.parse_term(str(term)) is term


def test_parse_errors() -> None:
    for text in ("sum(64)", "mul(X, Y", "nosuch(X)", "X Y"):
        with pytest.raises(ValueError):
            ab.parse_term(text)


# --------------------------------------------------------------------------- axioms as data


def test_axioms_are_named_data() -> None:
    names = [a.name for a in AXIOMS]
    assert len(names) == len(set(names))
    assert all(a.kind == "eq" for a in A_EQ) and all(a.kind == "sub" for a in A_SUB)
    assert all(a.law and a.source in ("Table 2", "extension") for a in AXIOMS)
    table2 = [a for a in AXIOMS if a.source == "Table 2"]
    assert len([a for a in table2 if a.kind == "eq"]) == 13  # Table 2's A_eq
    assert len([a for a in table2 if a.kind == "sub"]) == 8  # Table 2's A_sub


def test_no_cancellation_axiom() -> None:
    """The only axioms equating a compound term with a bare variable are the identities
    ``x = sum(1, x)`` / ``x = max(1, x)``: nothing like ``div(mul(x, y), y) = x``."""
    for axiom in A_EQ:
        bare = [side for side in (axiom.lhs, axiom.rhs) if side.op == "?"]
        if bare:
            other = axiom.rhs if axiom.lhs.op == "?" else axiom.lhs
            assert other.op in ("sum", "max") and other.param == 1, axiom.name
        for side in (axiom.lhs, axiom.rhs):
            assert "div(mul(?x, ?y), ?y)" not in str(side)


def test_every_head_argument_has_a_sub_axiom() -> None:
    """Theorem 1 needs every operator input to be a subexpression of its output."""
    covered = {(a.rhs.op, i) for a in A_SUB for i, arg in enumerate(a.rhs.args) if arg is a.lhs}
    commutative = {"add", "mul"}
    for name, head in HEADS.items():
        if name in ("var", "?"):
            continue
        for i in range(head.arity):
            assert (name, i) in covered or (name in commutative and (name, 0) in covered), (
                name,
                i,
            )


# --------------------------------------------------------------------------- Table 1 by OpKind


def test_every_op_kind_has_an_abstract_semantics() -> None:
    assert set(ABSTRACT_SEMANTICS) == set(OpKind)


def test_table1_entries() -> None:
    assert semantics(OpKind.INPUT, [], [], name="Q") is Q
    assert semantics(OpKind.MATMUL, [Q, K], [(8, 64), (64, 1024)]) is ab.sum(64, ab.mul(Q, K))
    assert semantics(OpKind.REDUCTION, [X], [(16, 1024)], dim=1) is ab.sum(1024, X)
    assert semantics(OpKind.REDUCTION, [X], [(16, 1024)], dim=1, to_dimx=True,
                     reduction_dimx=64) is ab.sum(16, X)  # fmt: skip
    assert semantics(OpKind.REDUCTION_MAX, [X], [(16, 1024)], dim=-1) is ab.max(1024, X)
    assert semantics(OpKind.SUB, [X, W], [(4,), (4,)]) is ab.add(X, W)
    assert semantics(OpKind.SQUARE, [X], [(4,)]) is ab.mul(X, X)
    assert semantics(OpKind.MUL_SCALAR, [X], [(4,)], scalar=0.5) is X
    assert semantics(OpKind.POW, [X], [(4,)], exponent=2.0) is ab.mul(X, X)
    assert semantics(OpKind.RESHAPE, [X], [(4, 4)]) is X
    assert semantics(OpKind.BLOCK_INPUT, [X], [(4, 4)]) is X
    assert semantics(OpKind.RMS_NORM, [X], [(16, 4096)]) is ab.rms_norm(4096, X)
    for kind in (OpKind.CUSTOMIZED, OpKind.THREAD_GRAPH):
        with pytest.raises(AbstractSemanticsError):
            semantics(kind, [X], [(4,)])


def test_forloop_accumulators() -> None:
    tile = (16, 64)  # a [m, k/F] tile, F = 8 iterations: the whole last dim is 512
    assert semantics(OpKind.FORLOOP_ACCUM, [X], [tile], forloop_range=8) is ab.sum(8, X)
    assert semantics(OpKind.FORLOOP_ACCUM, [X], [tile], forloop_range=8, acc="sum") is ab.sum(
        512, X
    )
    assert semantics(OpKind.FORLOOP_ACCUM, [X], [tile], forloop_range=8, acc="mean") is ab.sum(
        512, X
    )
    assert semantics(OpKind.FORLOOP_ACCUM, [X], [tile], forloop_range=8, acc="rms") is ab.rms(
        512, X
    )
    assert semantics(
        OpKind.FORLOOP_ACCUM, [X], [tile], forloop_range=8, acc="sum_todimx", reduction_dimx=4
    ) is ab.sum(128, X)
    assert semantics(OpKind.FORLOOP_ACCUM_MAX, [X], [tile], forloop_range=8) is ab.max(8, X)
    assert semantics(OpKind.FORLOOP_ACCUM_RESCALE, [X, W], [tile, (16, 1)],
                     forloop_range=8) is ab.sum(8, ab.mul(X, W))  # fmt: skip
    with pytest.raises(AbstractSemanticsError):
        semantics(OpKind.FORLOOP_ACCUM, [X], [tile])  # no forloop_range


def test_split_matmul_accumulates_to_the_whole_sum() -> None:
    """A matmul over a k/F tile accumulated over F iterations is the matmul over k."""
    tile = semantics(OpKind.MATMUL, [X, W], [(16, 64), (64, 32)])
    assert semantics(OpKind.FORLOOP_ACCUM, [tile], [(16, 32)], forloop_range=8) is ab.sum(
        512, ab.mul(X, W)
    )


def test_concat_then_matmul_is_the_section_7_2_operator() -> None:
    """(W||X) x (Y||Z) = add(sum(k1, mul(W, Y)), sum(k2, mul(X, Z)))  (paper §7.2)."""
    w, x, y, z = (ab.var(n) for n in "wxyz")
    left = semantics(OpKind.CONCAT, [w, x], [(16, 64), (16, 8)], dim=1)
    right = semantics(OpKind.CONCAT, [y, z], [(64, 32), (8, 32)], dim=0)
    assert left is ab.concat(w, x, -1, 64, 8) and right is ab.concat(y, z, -2, 64, 8)
    product = semantics(OpKind.MATMUL, [left, right], [(16, 72), (72, 32)])
    assert product is ab.add(ab.sum(64, ab.mul(w, y)), ab.sum(8, ab.mul(x, z)))
    # a concat along a dim the matmul does not reduce stays a concat (= add under A_eq)
    rows = semantics(OpKind.CONCAT, [w, x], [(16, 64), (8, 64)], dim=0)
    assert semantics(OpKind.MATMUL, [rows, y], [(24, 64), (64, 32)]) is ab.sum(64, ab.mul(rows, y))


def test_flashdecoding_through_the_table_is_the_target() -> None:
    """Fig. 4b: per block (P splits of n) and per iteration (F tiles of t): QK, exp, xV and a
    row sum, accumulated; then the P partials are summed and divided at the kernel level."""
    s, d, n, split, loops = 8, 64, 1024, 4, 8
    t = n // split // loops
    qk = semantics(OpKind.MATMUL, [Q, K], [(s, d), (d, t)])
    e = semantics(OpKind.EXP, [qk], [(s, t)])
    ev = semantics(OpKind.MATMUL, [e, V], [(s, t), (t, d)])
    row = semantics(OpKind.REDUCTION, [e], [(s, t)], dim=1)
    num = semantics(OpKind.FORLOOP_ACCUM, [ev], [(s, d)], forloop_range=loops)
    den = semantics(OpKind.FORLOOP_ACCUM, [row], [(s, 1)], forloop_range=loops)
    num_all = semantics(OpKind.REDUCTION, [num], [(split, s, d)], dim=0)
    den_all = semantics(OpKind.REDUCTION, [den], [(split, s, 1)], dim=0)
    out = semantics(OpKind.DIV, [num_all, den_all], [(1, s, d), (1, s, 1)])
    e_full = ab.exp(ab.sum(d, ab.mul(Q, K)))
    target = ab.div(ab.sum(n, ab.mul(e_full, V)), ab.sum(n, e_full))
    assert out is target
