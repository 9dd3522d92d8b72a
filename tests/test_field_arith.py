"""Tests of the exact Z_p × Z_q arithmetic used by the equivalence verifier."""

from __future__ import annotations

import decimal
import math
from fractions import Fraction

import numpy as np
import pytest

from mugraph.errors import ShapeError
from mugraph.semantics import field_arith as fa
from mugraph.semantics.field_arith import (
    FieldArray,
    FieldConstantError,
    FieldContext,
    FieldDivisionByZero,
    P,
    Q,
)

SMALL_P, SMALL_Q = 23, 11  # 23 = 2·11 + 1


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng(1234)


@pytest.fixture
def ctx(rng: np.random.Generator) -> FieldContext:
    return FieldContext.from_rng(rng)


def ref_matmul(a: np.ndarray, b: np.ndarray, m: int) -> np.ndarray:
    """Slow exact reference: Python ints in object arrays."""
    return np.asarray((a.astype(object) @ b.astype(object)) % m).astype(np.int64)


def ref_matmul_int64(a: np.ndarray, b: np.ndarray, m: int) -> np.ndarray:
    """Exact int64 reference for 2-D operands: each product reduced before summing."""
    out = np.zeros((a.shape[0], b.shape[1]), dtype=np.int64)
    for i in range(a.shape[0]):
        out[i] = ((a[i][:, None] * b) % m).sum(axis=0) % m
    return out


def assert_field_equal(x: FieldArray, y: FieldArray) -> None:
    assert x.shape == y.shape
    np.testing.assert_array_equal(x.p, y.p)
    np.testing.assert_array_equal(x.q, y.q)


# ---------------------------------------------------------------------------------------------
# primes and theorem helpers
# ---------------------------------------------------------------------------------------------


def test_primes() -> None:
    assert fa.is_prime(P) and fa.is_prime(Q)
    assert (P - 1) % Q == 0 and P < 2**31
    assert (P - 1) ** 2 < 2**62  # elementwise products exact in int64
    # P is the largest safe prime below 2^31
    assert not any(fa.is_prime(n) and fa.is_prime((n - 1) // 2) for n in range(P + 2, 2**31, 2))


def test_is_prime_small() -> None:
    primes = [n for n in range(200) if fa.is_prime(n)]
    assert primes == [n for n in range(2, 200) if all(n % d for d in range(2, n))]


@pytest.mark.parametrize("degree", [1, 2, 3, 8, 16, 1024])
def test_theorem3_max_terms(degree: int) -> None:
    k = fa.theorem3_max_terms(degree)
    assert degree * k**4 < Q <= degree * (k + 1) ** 4
    assert fa.theorem3_max_degree(k) >= degree


def test_theorem3_values() -> None:
    assert fa.theorem3_max_terms(1) == 181
    assert fa.theorem3_max_degree(181) == 1
    assert fa.theorem3_max_degree(10**4) == 0


def test_theorem4_rounds() -> None:
    assert fa.theorem4_rounds(1, 1e-9) == 1
    r = fa.theorem4_rounds(10, 1e-6)
    assert (1 - 1 / 10) ** r <= 1e-6 < (1 - 1 / 10) ** (r - 1)
    assert fa.theorem4_rounds(100, 0.01) == pytest.approx(100 * math.log(100), rel=0.01)


# ---------------------------------------------------------------------------------------------
# context, FieldArray, random
# ---------------------------------------------------------------------------------------------


def test_context_omega(ctx: FieldContext) -> None:
    assert ctx.omega != 1 and pow(ctx.omega, Q, P) == 1
    assert ctx.p == P and ctx.q == Q


def test_context_deterministic() -> None:
    a = FieldContext.from_rng(np.random.default_rng(7))
    b = FieldContext.from_rng(np.random.default_rng(7))
    c = FieldContext.from_rng(np.random.default_rng(8))
    assert a == b and a != c


def test_context_validation() -> None:
    with pytest.raises(ValueError):
        FieldContext(omega=2, key=0, p=P, q=Q - 2)  # q does not divide p - 1
    with pytest.raises(ValueError):
        FieldContext(omega=1, key=0, p=SMALL_P, q=SMALL_Q)  # omega = 1
    with pytest.raises(ValueError):
        FieldContext(omega=5, key=0, p=SMALL_P, q=SMALL_Q)  # 5^11 = -1 mod 23
    with pytest.raises(ValueError):
        FieldContext(omega=2, key=0, p=2**31 + 11, q=5)  # too large


def test_small_context_omega_uniform() -> None:
    rng = np.random.default_rng(0)
    seen = {FieldContext.from_rng(rng, p=SMALL_P, q=SMALL_Q).omega for _ in range(300)}
    roots = {w for w in range(2, SMALL_P) if pow(w, SMALL_Q, SMALL_P) == 1}
    assert seen == roots and len(roots) == SMALL_Q - 1


def test_random_canonical_and_reproducible(ctx: FieldContext) -> None:
    x = ctx.random((64, 33), np.random.default_rng(5))
    y = ctx.random((64, 33), np.random.default_rng(5))
    assert x.shape == (64, 33) and x.p.dtype == np.int64 and ctx.is_canonical(x)
    assert_field_equal(x, y)
    assert len(np.unique(x.p)) > 2000 and len(np.unique(x.q)) > 2000


def test_large_draws_do_not_depend_on_the_worker_count(ctx: FieldContext) -> None:
    """A draw of several parts (one seeded stream each) gives the same values however many
    threads fill the parts, into int64 or float64 memory."""
    n = 3 * fa._RANDOM_PART + 1234
    draws = []
    for workers, dtype in ((1, np.int64), (2, np.float64), (3, np.int64)):
        x = np.empty(n, dtype=dtype)
        with fa.parallel_evaluation(workers):
            ctx._fill_stream(99, x, P)
        draws.append(x)
    assert all(np.array_equal(draws[0], d) for d in draws[1:])
    assert draws[0].min() >= 0 and draws[0].max() < P


def test_random_uniform_small_primes() -> None:
    rng = np.random.default_rng(3)
    ctx = FieldContext.from_rng(rng, p=SMALL_P, q=SMALL_Q)
    x = ctx.random(253_000, rng)
    counts = np.bincount(x.p * SMALL_Q + x.q, minlength=SMALL_P * SMALL_Q)
    assert counts.shape == (SMALL_P * SMALL_Q,)
    # 1000 expected per pair; 6 standard deviations
    assert counts.min() > 1000 - 6 * 32 and counts.max() < 1000 + 6 * 32


def test_fieldarray_shapes(ctx: FieldContext, rng: np.random.Generator) -> None:
    x = FieldArray(np.arange(6).reshape(2, 3), np.int64(4))
    assert x.shape == (2, 3) and x.q.shape == (2, 3) and x.ndim == 2 and x.size == 6
    y = ctx.random((2, 3, 4), rng)
    assert y.reshape(6, 4).shape == (6, 4)
    assert y.transpose(2, 0, 1).shape == (4, 2, 3)
    assert y.swapaxes(0, 2).shape == (4, 3, 2)
    assert y[1, :, 2].shape == (3,)
    assert y.broadcast_to((5, 2, 3, 4)).shape == (5, 2, 3, 4)
    z = fa.concatenate([y, y[:, :1]], axis=1)
    assert z.shape == (2, 4, 4) and z[:, 3].equals(y[:, 0])
    assert y.copy().equals(y) and not y.equals(z)


def test_from_ints(ctx: FieldContext) -> None:
    vals = [-1, 0, 5, P, P + 3, -(10**30)]
    x = ctx.from_ints(np.array(vals, dtype=object))
    assert list(x.p) == [v % P for v in vals] and list(x.q) == [v % Q for v in vals]
    y = ctx.from_ints(np.array([-1, 7, 2**40]))
    assert list(y.p) == [P - 1, 7, 2**40 % P]
    with pytest.raises(FieldConstantError):
        ctx.from_ints(np.array([0.5]))


# ---------------------------------------------------------------------------------------------
# field axioms
# ---------------------------------------------------------------------------------------------


@pytest.fixture
def abc(ctx: FieldContext, rng: np.random.Generator) -> tuple[FieldArray, ...]:
    shape = (50, 40)
    a, b, c = (ctx.random(shape, rng) for _ in range(3))
    # include the extremes
    a.p[0, :3], a.q[0, :3] = [0, 1, P - 1], [0, 1, Q - 1]
    b.p[0, :3], b.q[0, :3] = [P - 1, P - 1, P - 1], [Q - 1, Q - 1, Q - 1]
    return a, b, c


def test_add_sub_neg(ctx: FieldContext, abc: tuple[FieldArray, ...]) -> None:
    a, b, c = abc
    assert_field_equal(ctx.add(a, b), ctx.add(b, a))
    assert_field_equal(ctx.add(ctx.add(a, b), c), ctx.add(a, ctx.add(b, c)))
    assert_field_equal(ctx.sub(a, b), ctx.add(a, ctx.neg(b)))
    assert_field_equal(ctx.add(a, ctx.neg(a)), ctx.zeros(a.shape))
    assert_field_equal(ctx.add(a, ctx.zeros(())), a)
    ref = FieldArray((a.p + b.p) % P, (a.q + b.q) % Q)
    assert_field_equal(ctx.add(a, b), ref)
    ref = FieldArray((a.p - b.p) % P, (a.q - b.q) % Q)
    assert_field_equal(ctx.sub(a, b), ref)
    for r in (ctx.add(a, b), ctx.sub(a, b), ctx.neg(a)):
        assert ctx.is_canonical(r)


def test_mul_axioms(ctx: FieldContext, abc: tuple[FieldArray, ...]) -> None:
    a, b, c = abc
    assert_field_equal(ctx.mul(a, b), ctx.mul(b, a))
    assert_field_equal(ctx.mul(ctx.mul(a, b), c), ctx.mul(a, ctx.mul(b, c)))
    assert_field_equal(ctx.mul(a, ctx.add(b, c)), ctx.add(ctx.mul(a, b), ctx.mul(a, c)))
    assert_field_equal(ctx.mul(a, ctx.ones(())), a)
    ref_p = np.array(
        [
            [int(x) * int(y) % P for x, y in zip(r, s, strict=True)]
            for r, s in zip(a.p, b.p, strict=True)
        ]
    )
    np.testing.assert_array_equal(ctx.mul(a, b).p, ref_p)
    assert ctx.is_canonical(ctx.mul(a, b))


def test_broadcasting(ctx: FieldContext, rng: np.random.Generator) -> None:
    a = ctx.random((4, 1, 3), rng)
    b = ctx.random((5, 1), rng)
    for op in (ctx.add, ctx.sub, ctx.mul):
        r = op(a, b)
        assert r.shape == (4, 5, 3)
        assert_field_equal(r[2, 3], op(a[2, 0], b[3]))


@pytest.mark.parametrize("m", [P, Q])
@pytest.mark.parametrize(
    ("sa", "sb"),
    [((2, 1024, 520), (2, 1024, 1)), ((2, 1024, 520), (1, 520)), ((3, 1, 5, 70_001), (7, 5, 1)),
     ((1 << 20,), ()), ((1100, 1000), (1100, 1000))],
)
def test_large_elementwise_matches_the_plain_kernels(
    rng: np.random.Generator, m: int, sa: tuple, sb: tuple
) -> None:
    """Results of at least _ELEMENTWISE_MIN elements are computed block by block (on the
    worker threads): the same values as the plain NumPy expressions, edge values included."""
    a = rng.integers(0, m, size=sa)
    b = rng.integers(0, m, size=sb) if sb else np.int64(m - 1)
    a.flat[:4] = [0, 1, m - 2, m - 1]
    if sb:
        b.flat[:4] = [m - 1, 0, m - 1, 1]
    assert math.prod(np.broadcast_shapes(a.shape, np.shape(b))) >= fa._ELEMENTWISE_MIN
    expect = {"add": (a + b) % m, "sub": (a - b) % m, "mul": (a * b) % m}  # a·b < 2^62
    for workers in (1, 2):
        with fa.parallel_evaluation(workers):
            for name, fn in (("add", fa.add_mod), ("sub", fa.sub_mod), ("mul", fa.mul_mod)):
                got = fn(a, b, m)
                assert got.flags.c_contiguous and got.dtype == np.int64
                np.testing.assert_array_equal(got, expect[name], err_msg=name)
            np.testing.assert_array_equal(fa.neg_mod(a, m), (-a) % m)


@pytest.mark.parametrize("n", [37, 100_003])  # Fermat path and batch-inversion path
def test_inverse(ctx: FieldContext, rng: np.random.Generator, n: int) -> None:
    a = ctx.random(n, rng)
    a = FieldArray(np.maximum(a.p, 1), np.maximum(a.q, 1))
    inv = ctx.inv(a)
    assert_field_equal(ctx.mul(a, inv), ctx.ones(n))
    idx = rng.integers(0, n, 20)
    assert [int(v) for v in inv.p[idx]] == [pow(int(v), -1, P) for v in a.p[idx]]
    assert [int(v) for v in inv.q[idx]] == [pow(int(v), -1, Q) for v in a.q[idx]]
    b = ctx.random(n, rng)
    assert_field_equal(ctx.mul(ctx.div(b, a), a), b)


def test_div_broadcast_divisor(ctx: FieldContext, rng: np.random.Generator) -> None:
    x = ctx.random((6, 8), rng)
    d = ctx.add(ctx.random((6, 1), rng), ctx.ones(()))  # nonzero unless p-1 drawn
    d = FieldArray(np.maximum(d.p, 1), np.maximum(d.q, 1))
    r = ctx.div(x, d)
    assert r.shape == (6, 8)
    assert_field_equal(ctx.mul(r, d), x)


@pytest.mark.parametrize("n", [5, 50_000])
@pytest.mark.parametrize("component", ["p", "q"])
def test_division_by_zero(ctx: FieldContext, rng: np.random.Generator, n: int, component: str):
    d = ctx.random(n, rng)
    d = FieldArray(np.maximum(d.p, 1), np.maximum(d.q, 1))
    getattr(d, component)[n // 2] = 0
    with pytest.raises(FieldDivisionByZero) as info:
        ctx.div(ctx.ones(n), d)
    assert info.value.component == component and info.value.count == 1
    assert isinstance(info.value, ArithmeticError)


def test_pow(ctx: FieldContext, abc: tuple[FieldArray, ...]) -> None:
    a = abc[0]
    assert_field_equal(ctx.pow(a, 0), ctx.ones(a.shape))
    assert_field_equal(ctx.pow(a, 1), a)
    assert_field_equal(ctx.pow(a, 2), ctx.square(a))
    a5 = ctx.mul(ctx.mul(ctx.square(a), ctx.square(a)), a)
    assert_field_equal(ctx.pow(a, 5), a5)
    assert_field_equal(ctx.pow(a, 5.0), a5)
    big = 3 * (P - 1) * (Q - 1) + 5  # exponent reduction must keep 0^e = 0
    assert_field_equal(ctx.pow(a, big), a5)
    assert ctx.pow(a, big).p[0, 0] == 0 and ctx.pow(a, 0).p[0, 0] == 1
    for bad in (-1, 0.5, True):
        with pytest.raises(ValueError):
            ctx.pow(a, bad)


def test_sum(ctx: FieldContext, rng: np.random.Generator) -> None:
    x = ctx.random((3, 70, 5), rng)
    s = ctx.sum(x, axis=1)
    assert s.shape == (3, 5)
    assert int(s.p[1, 2]) == sum(int(v) for v in x.p[1, :, 2]) % P
    assert int(s.q[1, 2]) == sum(int(v) for v in x.q[1, :, 2]) % Q
    assert ctx.sum(x, axis=1, keepdims=True).shape == (3, 1, 5)
    assert ctx.sum(x, axis=(0, 2)).shape == (70,)
    total = ctx.sum(x)
    assert total.shape == () and int(total.p) == sum(int(v) for v in x.p.ravel()) % P


@pytest.mark.parametrize("workers", [1, 2])
def test_large_sums_of_strided_views_are_exact(rng: np.random.Generator, workers: int) -> None:
    """Sums of a million elements or more run in the operand's memory order (slab by slab
    when the summed axes are outside the kept ones): each against Python's exact sum, for
    a weight's tiles over a for-loop, a tile view summed over two axes, a sum over the
    innermost axis and one over more slabs than are added one by one; int64 operands and
    float64 ones (a random input's mirror)."""
    m = fa.P
    w = rng.integers(0, m, size=(1024, 2048), dtype=np.int64)
    lanes = rng.integers(0, m, size=(8, 4, 64, 512), dtype=np.int64)
    tiles = np.lib.stride_tricks.as_strided(  # (loop, grid x, grid y, rows, cols) of w
        w, shape=(4, 2, 16, 128, 128), strides=tuple(8 * s for s in (
            128 * 2048, 512 * 2048, 128, 2048, 1)))
    cases = [
        (tiles, 0), (tiles, (0, 1)), (tiles, -1), (w, 0), (w.T, 1), (lanes, (0, 2)),
        (lanes.transpose(3, 1, 0, 2), 2), (w.reshape(2, 512, 2048), 0),
    ]
    # a reversed view, and a broadcast one (an axis of stride 0) summed along and across it
    column = rng.integers(0, m, size=(1024, 1), dtype=np.int64)
    cases += [(w[::-1, ::2], 0), (np.broadcast_to(column, (1024, 2048)), 1),
              (np.broadcast_to(column, (1024, 2048)), 0), (tiles[:, :, :, ::-1], 0)]
    # a random input's float64 mirror is summed as it is (no int64 copy of it first)
    cases += [(x.astype(np.float64), axis) for x, axis in cases[:4]]
    with fa.parallel_evaluation(workers):
        for x, axis in cases:
            assert x.size >= fa._SUM_SPLIT_MIN
            expected = np.sum(x, axis=axis, keepdims=True, dtype=object) % m
            got = fa.sum_mod(x, m, axis=axis, keepdims=True)
            assert got.shape == expected.shape and got.dtype == np.int64
            assert np.array_equal(got, expected.astype(np.int64)), (x.shape, axis)
            flat = fa.sum_mod(x, m, axis=axis)
            assert np.array_equal(flat, np.squeeze(got, axis=axis))


@pytest.mark.parametrize("n", [fa._BATCH_INV_MIN, 50_001, 131_073, 1 << 20])
def test_batch_inversion_at_every_row_count(rng: np.random.Generator, n: int) -> None:
    """Montgomery's batch inversion (its grid has 8 to 64 rows by size, the last row padded
    with ones) gives x·x^-1 = 1 for every element, and the same values as Fermat's x^(m-2)."""
    m = fa.P
    x = rng.integers(1, m, size=(n,), dtype=np.int64)
    inverse = fa.inv_mod(x, m)
    assert np.all(fa.mul_mod(x, inverse, m) == 1)
    sample = rng.integers(0, n, size=64)
    assert np.array_equal(inverse[sample], fa.pow_mod(x[sample], m - 2, m))
    x[n // 3] = 0
    with pytest.raises(FieldDivisionByZero):
        fa.inv_mod(x, m)


# ---------------------------------------------------------------------------------------------
# constants
# ---------------------------------------------------------------------------------------------


def test_rational_constants(ctx: FieldContext, rng: np.random.Generator) -> None:
    x = ctx.random((7, 9), rng)
    third = ctx.mul_const(x, Fraction(1, 3))
    assert_field_equal(ctx.mul_const(third, 3), x)
    assert_field_equal(ctx.mul_const(ctx.const(Fraction(1, 3)), 3), ctx.ones(()))
    assert_field_equal(ctx.mul_const(ctx.const(0.125), 8), ctx.ones(()))
    assert_field_equal(ctx.mul_const(x, 0.125), ctx.mul_const(x, Fraction(1, 8)))
    assert ctx.scalar(-2) == (P - 2, Q - 2)
    assert ctx.scalar(0.1) == ctx.scalar(Fraction(0.1))  # the exact dyadic value of 0.1
    assert ctx.scalar(0.1) != ctx.scalar(Fraction(1, 10))
    assert ctx.scalar(decimal.Decimal("0.1")) == ctx.scalar(Fraction(1, 10))
    assert ctx.scalar(np.float32(0.5)) == ctx.scalar(Fraction(1, 2))
    inv_sqrt = 1 / math.sqrt(128)
    assert ctx.scalar(inv_sqrt) == ctx.scalar(Fraction(inv_sqrt))
    assert ctx.const(3, (2, 2)).shape == (2, 2)


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -math.inf, np.float32("nan"), 1j, "1"])
def test_unmappable_constants(ctx: FieldContext, bad: object) -> None:
    with pytest.raises(FieldConstantError):
        ctx.scalar(bad)


def test_constant_denominator_multiple_of_p() -> None:
    with pytest.raises(FieldConstantError):
        fa.field_scalar(Fraction(1, P), P)


# ---------------------------------------------------------------------------------------------
# exp
# ---------------------------------------------------------------------------------------------


def test_exp_homomorphism(ctx: FieldContext, abc: tuple[FieldArray, ...]) -> None:
    a, b, _ = abc
    ea, eb, eab = ctx.exp(a), ctx.exp(b), ctx.exp(ctx.add(a, b))
    np.testing.assert_array_equal(eab.p, ctx.mul(ea, eb).p)  # ω^(a+b) = ω^a ω^b
    np.testing.assert_array_equal(ctx.mul(ea, ctx.exp(ctx.neg(a))).p, 1)
    np.testing.assert_array_equal(ctx.exp(ctx.zeros(3)).p, 1)
    assert ctx.is_canonical(ea)


def test_exp_matches_pow(ctx: FieldContext, rng: np.random.Generator) -> None:
    e = np.concatenate([[0, 1, 2**15 - 1, 2**15, Q - 1], rng.integers(0, Q, 200)])
    got = ctx.exp_p(e)
    assert [int(v) for v in got] == [pow(ctx.omega, int(v), P) for v in e]


def test_exp_root_of_unity(ctx: FieldContext) -> None:
    assert pow(ctx.omega, Q, P) == 1
    w = ctx.exp(FieldArray(np.int64(0), np.int64(1)))
    assert int(w.p) == ctx.omega
    np.testing.assert_array_equal(ctx.pow(w, Q).p, 1)  # ω^q = 1
    assert all(int(ctx.pow(w, k).p) != 1 for k in (1, 2, 3, Q - 1))


def test_exp_q_component(ctx: FieldContext, rng: np.random.Generator) -> None:
    a = ctx.random(1000, rng)
    # the q part is a function of the p value: equal exp values have equal q parts
    b = FieldArray(rng.integers(0, P, 1000), a.q)
    assert_field_equal(ctx.exp(a), ctx.exp(b))
    e = ctx.exp(a)
    assert len(np.unique(e.q)) > 990 and ctx.is_canonical(e)
    other = FieldContext.from_rng(np.random.default_rng(99))
    assert not np.array_equal(other.exp(a).q, e.q)


def test_exp_small_field_exhaustive() -> None:
    ctx = FieldContext.from_rng(np.random.default_rng(0), p=SMALL_P, q=SMALL_Q)
    e = np.arange(SMALL_Q)
    got = ctx.exp(FieldArray(np.zeros_like(e), e)).p
    assert [int(v) for v in got] == [pow(ctx.omega, int(v), SMALL_P) for v in e]
    assert len(set(got.tolist())) == SMALL_Q  # the q distinct q-th roots of unity


# ---------------------------------------------------------------------------------------------
# matmul
# ---------------------------------------------------------------------------------------------

MATMUL_SHAPES = [
    ((5, 7), (7, 3)),
    ((3, 300), (300, 4)),
    ((300, 20), (20, 2)),
    ((2, 3, 200), (2, 200, 5)),
    ((1, 3, 5), (2, 5, 4)),
    ((2, 1, 3, 70), (4, 70, 9)),
    ((7,), (7,)),
    ((7,), (7, 3)),
    ((4, 7), (7,)),
    ((3, 1000), (1000, 2)),
]


@pytest.mark.parametrize("limbs", [None, 2, 3, 4])
@pytest.mark.parametrize(("sa", "sb"), MATMUL_SHAPES)
def test_matmul_small(ctx: FieldContext, rng: np.random.Generator, sa, sb, limbs) -> None:
    a, b = ctx.random(sa, rng), ctx.random(sb, rng)
    r = ctx.matmul(a, b, limbs=limbs)
    assert r.shape == np.matmul(np.zeros(sa), np.zeros(sb)).shape
    np.testing.assert_array_equal(r.p, ref_matmul(a.p, b.p, P))
    np.testing.assert_array_equal(r.q, ref_matmul(a.q, b.q, Q))


@pytest.mark.parametrize("m", [P, Q])
@pytest.mark.parametrize("limbs", [2, 3, 4])
def test_matmul_worst_case_digits(m: int, limbs: int) -> None:
    """Every digit product at its bound, at and just past the exact chunk length."""
    plan = fa.gemm_plan(m, limbs)
    # v = 2^(s-1) has lowest balanced digit -2^(s-1): digit partial sums reach k·D·(m-1)
    worst = 1 << (plan.digit_bits - 1)
    for k in (plan.chunk, plan.chunk + 1) if plan.chunk < 20_000 else (plan.chunk,):
        a = np.full((2, k), worst, dtype=np.int64)
        a[1] = m - 1
        b = np.full((k, 3), m - 1, dtype=np.int64)
        expect = ref_matmul_int64(a, b, m)
        np.testing.assert_array_equal(fa.matmul_mod(a, b, m, limbs=limbs), expect)
        np.testing.assert_array_equal(fa.matmul_mod(b.T, a.T, m, limbs=limbs), expect.T)


def test_gemm_plans() -> None:
    assert [fa.gemm_plan(P, n).chunk for n in (1, 2, 3, 4)] == [0, 128, 4096, 32768]
    assert [fa.gemm_plan(Q, n).chunk for n in (2, 3, 4)] == [256, 8192, 65536]
    for m in (P, Q):
        for n in (2, 3, 4):
            plan = fa.gemm_plan(m, n)
            assert plan.chunk * plan.digit_bound * (m - 1) <= 2**53 - 2
            assert plan.digit_bits * n >= (m - 1).bit_length() + 1


@pytest.mark.parametrize(("rows", "k", "cols"), [(3, 4096, 600), (4, 14336, 80), (90, 14336, 3)])
def test_matmul_long_reductions(ctx: FieldContext, rng: np.random.Generator, rows, k, cols):
    """k = 4096 and k = 14336 (multi-chunk, converted in threaded slices) vs int64 reference."""
    a, b = ctx.random((rows, k), rng), ctx.random((k, cols), rng)
    r = ctx.matmul(a, b)
    ri, ci = slice(0, min(rows, 4)), slice(0, min(cols, 40))
    np.testing.assert_array_equal(r.p[ri, ci], ref_matmul_int64(a.p[ri], b.p[:, ci], P))
    np.testing.assert_array_equal(r.q[ri, ci], ref_matmul_int64(a.q[ri], b.q[:, ci], Q))
    for limbs in (2, 4):
        np.testing.assert_array_equal(ctx.matmul(a, b, limbs=limbs).p, r.p)


def test_matmul_linearity(ctx: FieldContext, rng: np.random.Generator) -> None:
    a, b, c = ctx.random((2, 16, 512), rng), ctx.random((2, 512, 24), rng), None
    c = ctx.random((2, 512, 24), rng)
    assert_field_equal(ctx.matmul(a, ctx.add(b, c)), ctx.add(ctx.matmul(a, b), ctx.matmul(a, c)))


def test_matmul_small_primes_single_limb() -> None:
    rng = np.random.default_rng(0)
    ctx = FieldContext.from_rng(rng, p=SMALL_P, q=SMALL_Q)
    a, b = ctx.random((4, 50), rng), ctx.random((50, 6), rng)
    assert fa.gemm_plan(SMALL_P, 1).chunk > 10**12
    np.testing.assert_array_equal(ctx.matmul(a, b).p, ref_matmul(a.p, b.p, SMALL_P))
    np.testing.assert_array_equal(ctx.matmul(a, b, limbs=1).q, ref_matmul(a.q, b.q, SMALL_Q))


def test_matmul_errors(ctx: FieldContext, rng: np.random.Generator) -> None:
    with pytest.raises(ShapeError):
        ctx.matmul(ctx.random((2, 3), rng), ctx.random((4, 2), rng))
    with pytest.raises(ShapeError):
        ctx.matmul(ctx.random((2, 2, 3), rng), ctx.random((3, 3, 2), rng))
    with pytest.raises(ShapeError):
        ctx.matmul(ctx.random((), rng), ctx.random((3,), rng))
    with pytest.raises(ValueError):
        fa.matmul_mod(np.ones((2, 2), np.int64), np.ones((2, 2), np.int64), P, limbs=1)
    empty = ctx.matmul(ctx.random((2, 0), rng), ctx.random((0, 3), rng))
    assert_field_equal(empty, ctx.zeros((2, 3)))


# ---------------------------------------------------------------------------------------------
# uninterpreted functions
# ---------------------------------------------------------------------------------------------


def test_uninterpreted_deterministic_and_keyed(ctx: FieldContext, rng: np.random.Generator):
    x = ctx.random((30, 40), rng)
    r1 = fa.uninterpreted("relu", 17, x)
    assert_field_equal(r1, fa.uninterpreted("relu", 17, x.copy()))
    assert ctx.is_canonical(r1) and r1.shape == x.shape
    for other in (
        fa.uninterpreted("relu", 18, x),
        fa.uninterpreted("relu", b"17", x),
        fa.uninterpreted("sqrt", 17, x),
        fa.uninterpreted("relu", 17, x, 0.5),
    ):
        assert np.mean(other.p == r1.p) < 0.01 and np.mean(other.q == r1.q) < 0.01
    # elementwise: each output depends only on its own input value
    assert_field_equal(fa.uninterpreted("relu", 17, x[3:5, 7]), r1[3:5, 7])
    # different values → different outputs; equal values → equal outputs
    y = FieldArray(np.repeat(x.p[:1], 2, axis=0), np.repeat(x.q[:1], 2, axis=0))
    ry = fa.uninterpreted("relu", 17, y)
    assert_field_equal(ry[0], ry[1])
    z = FieldArray(x.p, (x.q + 1) % Q)  # same p components, different q components
    assert np.mean(fa.uninterpreted("relu", 17, z).p == r1.p) < 0.01


def test_uninterpreted_params_by_value(ctx: FieldContext, rng: np.random.Generator) -> None:
    x = ctx.random(100, rng)
    a = fa.uninterpreted("clamp", 1, x, 0, 1)
    assert_field_equal(a, fa.uninterpreted("clamp", 1, x, 0.0, Fraction(1)))
    assert_field_equal(a, fa.uninterpreted("clamp", 1, x, np.float32(0), np.int64(1)))
    assert not np.array_equal(a.p, fa.uninterpreted("clamp", 1, x, 0, 2).p)
    assert_field_equal(
        ctx.uninterpreted("clamp", x, 0, 1), fa.uninterpreted("clamp", ctx.key, x, 0, 1)
    )


def test_uninterpreted2(ctx: FieldContext, rng: np.random.Generator) -> None:
    a, b = ctx.random(500, rng), ctx.random(500, rng)
    f = ctx.uninterpreted2("atan2", a, b)
    assert_field_equal(f, ctx.uninterpreted2("atan2", a, b))
    assert np.mean(f.p == ctx.uninterpreted2("atan2", b, a).p) < 0.01
    s = ctx.uninterpreted2("hypot", a, b, symmetric=True)
    assert_field_equal(s, ctx.uninterpreted2("hypot", b, a, symmetric=True))
    assert np.mean(s.p == ctx.uninterpreted2("hypot", a, a, symmetric=True).p) < 0.01
    assert ctx.is_canonical(f) and ctx.is_canonical(s)


def test_uninterpreted_reduce(ctx: FieldContext, rng: np.random.Generator) -> None:
    x = ctx.random((20, 64), rng)
    r = ctx.uninterpreted_reduce("logsumexp", x, axis=1)
    assert r.shape == (20,) and ctx.is_canonical(r)
    perm = rng.permutation(64)
    assert_field_equal(r, ctx.uninterpreted_reduce("logsumexp", x[:, perm], axis=1))
    assert ctx.uninterpreted_reduce("logsumexp", x, 1, keepdims=True).shape == (20, 1)
    dropped = ctx.uninterpreted_reduce("logsumexp", x[:, :63], axis=1)
    assert np.all(dropped.p != r.p)
    assert_field_equal(ctx.uninterpreted_reduce("logsumexp", x.transpose(1, 0), axis=0), r)


def test_keyed_max_semilattice(ctx: FieldContext, rng: np.random.Generator) -> None:
    a, b, c = (ctx.random(2000, rng) for _ in range(3))
    ab = ctx.max(a, b)
    assert_field_equal(ab, ctx.max(b, a))
    assert_field_equal(ctx.max(ab, c), ctx.max(a, ctx.max(b, c)))
    assert_field_equal(ctx.max(a, a), a)
    picked_a = ab.p == a.p
    assert 0.45 < picked_a.mean() < 0.55  # a random order: a wins about half the time
    np.testing.assert_array_equal(np.where(picked_a, a.q, b.q), ab.q)  # pairs stay together
    other = FieldContext.from_rng(np.random.default_rng(1))
    assert np.mean(other.max(a, b).p == ab.p) < 0.75  # the order depends on the key


def test_keyed_max_reduce_tiling(ctx: FieldContext, rng: np.random.Generator) -> None:
    x = ctx.random((8, 96), rng)
    full = ctx.max_reduce(x, axis=1)
    assert full.shape == (8,)
    # tiled: max over 3 tiles, then a for-loop accumulation of the tile maxima
    tiles = [ctx.max_reduce(x[:, i : i + 32], axis=1) for i in (0, 32, 64)]
    acc = tiles[0]
    for t in tiles[1:]:
        acc = ctx.max(acc, t)
    assert_field_equal(acc, full)
    assert_field_equal(ctx.max_reduce(x[:, ::-1], axis=-1), full)
    kept = ctx.max_reduce(x, axis=1, keepdims=True)
    assert kept.shape == (8, 1) and kept[:, 0].equals(full)
    # the result is one of the elements
    assert all(full.p[i] in x.p[i] for i in range(8))
    assert not np.array_equal(ctx.max_reduce(x, axis=1, name="min").p, full.p)
