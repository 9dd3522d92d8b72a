"""The tiled exact matrix product (mugraph.semantics.field_gemm and field_arith's tiling) against
a plain big-integer reference: every layout (limbs along the free dim or along the reduction),
either operand split, batches that do and do not stack as views, long reductions cut into
chunks, float64 / int64 / strided operands, values at and near the modulus, any thread
count; and the exact reductions it is built on at the edges of their ranges."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from mugraph.semantics import field_arith as fa
from mugraph.semantics import field_gemm as fg
from mugraph.semantics.field_arith import P, Q

SMALL_P = 23


def big_matmul(a: np.ndarray, b: np.ndarray, m: int) -> np.ndarray:
    """(a @ b) mod m with Python integers (object arrays): the reference."""
    a, b = (np.asarray(x).astype(np.int64).astype(object) for x in (a, b))
    return np.asarray((a @ b) % m).astype(np.int64)


def draw(rng: np.random.Generator, shape, m: int, kind: str) -> np.ndarray:
    """Canonical values: uniform, or crowded at the top (m-1, m-2...) or the bottom."""
    if kind == "top":
        return m - 1 - rng.integers(0, 3, shape)
    if kind == "bottom":
        return rng.integers(0, 3, shape)
    if kind == "mixed":
        return np.where(rng.random(shape) < 0.5, m - 1 - rng.integers(0, 2, shape),
                        rng.integers(0, m, shape))
    return rng.integers(0, m, shape)


def forced(monkeypatch, limbs: int, stack_k: bool) -> None:
    """Make matmul_mod use this layout whatever the cost model says."""
    monkeypatch.setattr(fa, "choose_layout", lambda m, _limbs, _b, _r, _k, _c, split_left, _t:
                        fg.GemmLayout(fg.gemm_plan(m, limbs), split_left, stack_k))
    assert fa.choose_layout(P, None, 1, 2, 3, 4, True, fg.TileBudget(1, 1)).plan.limbs == limbs


# ---- exact reductions ------------------------------------------------------------------------

EDGES = [0, 1, 2, -1, -2, (1 << 53) - 2, -((1 << 53) - 2), (1 << 50), -(1 << 50)]


def _edge_values(m: int, limit: int) -> np.ndarray:
    values = set()
    for v in EDGES:
        if abs(v) <= limit:
            values.add(v)
    for k in (1, 2, 3, 12345, limit // m - 1, limit // m):
        for d in (-2, -1, 0, 1, 2):
            for sign in (1, -1):
                v = sign * (k * m + d)
                if abs(v) <= limit:
                    values.add(v)
    rng = np.random.default_rng(5)
    values.update(int(v) for v in rng.integers(-limit, limit, 2000, dtype=np.int64))
    return np.array(sorted(values), dtype=np.float64)


@pytest.mark.parametrize("m", [P, Q, SMALL_P])
def test_fred_stays_congruent_and_small(m: int) -> None:
    x = _edge_values(m, fg.F64_EXACT)
    got = fg.fred_(x.copy(), m)
    for v, r in zip(x.astype(object), got, strict=True):
        assert float(r).is_integer() and -m - 2 <= r <= m + 2 and (int(v) - int(r)) % m == 0


@pytest.mark.parametrize("m", [P, Q, SMALL_P])
def test_mod_exact_is_canonical_up_to_2_50(m: int) -> None:
    x = _edge_values(m, 1 << 50)
    got = fg.mod_exact_(x.copy(), m)
    expect = np.array([int(v) % m for v in x.astype(np.int64)], dtype=np.float64)
    np.testing.assert_array_equal(got, expect)


@pytest.mark.parametrize("m", [P, Q])
def test_canon_int_is_canonical(m: int) -> None:
    x = _edge_values(m, fg.F64_EXACT).astype(np.int64)
    got = fg.canon_int_(x.copy(), m, np.empty_like(x))
    np.testing.assert_array_equal(got, np.array([int(v) % m for v in x], dtype=np.int64))


@pytest.mark.parametrize("m", [P, Q])
def test_canon_int_into_writes_the_canonical_value_and_keeps_x(m: int) -> None:
    x = _edge_values(m, fg.F64_EXACT).astype(np.int64)
    kept = x.copy()
    out = np.full((x.size, 3), -1, dtype=np.int64)[:, 1]  # a strided target, as a tile is
    fg.canon_int_into(x, m, out, np.empty_like(x))
    np.testing.assert_array_equal(out, np.array([int(v) % m for v in x], dtype=np.int64))
    np.testing.assert_array_equal(x, kept)


# ---- operands --------------------------------------------------------------------------------


@pytest.mark.parametrize("m", [P, Q])
@pytest.mark.parametrize("limbs", [2, 3, 4])
@pytest.mark.parametrize(("split_left", "stack_k"), list(itertools.product([True, False],
                                                                            repeat=2)))
def test_digits_recombine_within_their_bound(m, limbs, split_left, stack_k) -> None:
    rng = np.random.default_rng(limbs)
    layout = fg.GemmLayout(fg.gemm_plan(m, limbs), split_left, stack_k)
    s = draw(rng, (2, 5, 7), m, "mixed")
    d = fg.digits(s, layout)
    axis = -2 if split_left != stack_k else -1
    size = s.shape[axis]
    assert d.shape[axis] == limbs * size and np.abs(d).max() <= layout.plan.digit_bound
    blocks = np.split(d, limbs, axis=axis)
    total = sum(b.astype(object) * (1 << (layout.plan.digit_bits * i))
                for i, b in enumerate(blocks))
    np.testing.assert_array_equal(total.astype(np.int64), s)


@pytest.mark.parametrize("m", [P, Q])
@pytest.mark.parametrize("limbs", [2, 3, 4])
@pytest.mark.parametrize("split_left", [True, False])
def test_scaled_stack_is_canonical_powers(m, limbs, split_left) -> None:
    rng = np.random.default_rng(7)
    layout = fg.GemmLayout(fg.gemm_plan(m, limbs), split_left, True)
    w = draw(rng, (3, 6, 4), m, "mixed")
    stacked = fg.scaled_stack(w.astype(np.float64), layout)
    blocks = np.split(stacked, limbs, axis=-2 if split_left else -1)
    for i, block in enumerate(blocks):
        factor = pow(2, layout.plan.digit_bits * i, m)
        expect = (w.astype(object) * factor) % m
        np.testing.assert_array_equal(block.astype(np.int64), expect.astype(np.int64))


# ---- whole products --------------------------------------------------------------------------

SHAPES = [
    ((5, 7), (7, 3)),
    ((3, 300), (300, 4)),  # chunked reductions (k > 128 or 256 with 2 limbs)
    ((300, 20), (20, 2)),  # the right operand split
    ((2, 3, 200), (2, 200, 5)),
    ((4, 2, 33, 64), (4, 2, 64, 70)),  # attention-like: short reduction, larger output
    ((1, 9), (9, 40)),
    ((40, 9), (9, 1)),
    ((2, 1, 300, 130), (2, 1, 130, 3)),
]


@pytest.mark.parametrize("kind", ["uniform", "top", "mixed"])
@pytest.mark.parametrize(("limbs", "stack_k"), [(2, False), (2, True), (3, False), (3, True),
                                                (4, False), (4, True)])
@pytest.mark.parametrize("m", [P, Q])
def test_every_layout_equals_big_integers(monkeypatch, m, limbs, stack_k, kind) -> None:
    forced(monkeypatch, limbs, stack_k)
    rng = np.random.default_rng(limbs * 10 + stack_k)
    for sa, sb in SHAPES:
        a, b = draw(rng, sa, m, kind), draw(rng, sb, m, kind)
        expect = big_matmul(a, b, m)
        np.testing.assert_array_equal(fa.matmul_mod(a, b, m), expect, err_msg=f"{sa} @ {sb}")
        floats = fa.matmul_mod(a.astype(np.float64), b.astype(np.float64), m)
        np.testing.assert_array_equal(floats, expect, err_msg=f"{sa} @ {sb} (float64)")


@pytest.mark.parametrize("m", [P, Q])
def test_chosen_layouts_equal_big_integers_with_threads(m) -> None:
    rng = np.random.default_rng(3)
    for sa, sb in SHAPES + [((64, 64), (64, 700)), ((3, 1100), (1100, 50))]:
        a, b = draw(rng, sa, m, "mixed"), draw(rng, sb, m, "uniform")
        expect = big_matmul(a, b, m)
        for workers in (1, 2, 3):
            with fa.parallel_evaluation(workers):
                np.testing.assert_array_equal(fa.matmul_mod(a, b, m), expect)


def test_worst_case_sums_at_every_stacked_bound(monkeypatch) -> None:
    """Digits at their bound against m - 1 at the longest reduction a chunk takes when limbs
    go along the reduction (L·k = chunk), and one past it (two chunks)."""
    for m, limbs in itertools.product((P, Q), (2, 3)):
        plan = fg.gemm_plan(m, limbs)
        forced(monkeypatch, limbs, True)
        worst = 1 << (plan.digit_bits - 1)  # lowest balanced digit -2^(s-1)
        for k in (plan.chunk // limbs, plan.chunk // limbs + 1):
            if k > 3000:
                continue
            a = np.full((2, k), worst, dtype=np.int64)
            a[1] = m - 1
            b = np.full((k, 3), m - 1, dtype=np.int64)
            expect = big_matmul(a, b, m)
            np.testing.assert_array_equal(fa.matmul_mod(a, b, m), expect)
            np.testing.assert_array_equal(fa.matmul_mod(b.T, a.T, m), expect.T)


def test_strided_and_transposed_operands() -> None:
    rng = np.random.default_rng(11)
    big = draw(rng, (40, 90), P, "mixed")
    for a, b in [(big[::2, :30], big[:30, ::3]), (big[:20, :30].T, big[5:25, 40:70]),
                 (big.astype(np.float64)[:30, 1:31].T, big[:30, :7])]:
        np.testing.assert_array_equal(fa.matmul_mod(a, b, P), big_matmul(a, b, P))


def test_batches_that_do_not_stack_as_views() -> None:
    """A broadcast batch axis before a varying one cannot be merged into one axis: the tiles
    then go item by item (_matmul_core directly, below matmul_mod's folding)."""
    rng = np.random.default_rng(12)
    x = draw(rng, (1, 3, 6, 40), P, "uniform")
    y = draw(rng, (2, 3, 40, 5), P, "top")
    assert fa._merged(np.broadcast_to(x, (2, 3, 6, 40)), 2) is None
    expect = big_matmul(np.broadcast_to(x, (2, 3, 6, 40)), y, P)
    for workers in (1, 2):
        with fa.parallel_evaluation(workers):
            np.testing.assert_array_equal(fa._matmul_core(x, y, P, None), expect)


@pytest.mark.parametrize("dtype", [np.int64, np.float64])
def test_small_matrices_whose_batch_axes_do_not_merge_go_in_groups(dtype) -> None:
    """Split-KV attention's ``E[:, part] @ V[part, :]``: E (b, rows, n) viewed as (b, parts,
    rows, n / parts) has batch axes that cannot merge into one, and each matrix is small.
    The product copies E once (as float64) so that a tile takes a group of matrices; its
    values are the big-integer product's, whatever E's dtype and the thread count."""
    rng = np.random.default_rng(13)
    e = draw(rng, (3, 7, 64), P, "mixed").astype(dtype)
    v = draw(rng, (3, 64, 5), P, "top").astype(np.float64)
    ev, vv = e.reshape(3, 7, 4, 16).transpose(0, 2, 1, 3), v.reshape(3, 4, 16, 5)
    assert fa._merged(ev, 2) is None
    items = fa._as_items((3, 4), vv, ev, np.empty((3, 4, 7, 5), dtype=np.int64))
    assert isinstance(items[1], np.ndarray) and items[1].shape == (12, 7, 16)  # one stack
    expect = big_matmul(ev, vv, P)
    for workers in (1, 2):
        with fa.parallel_evaluation(workers):
            np.testing.assert_array_equal(fa._matmul_core(ev, vv, P, None), expect)


def test_tiles_cover_the_output_once() -> None:
    for count, extent, across in [(1, 4096, 2048), (128, 64, 32), (5, 7, 3), (1, 1, 1),
                                  (300, 4096, 16)]:
        for workers in (1, 2, 4):
            fa._WORKERS, saved = workers, fa._WORKERS
            try:
                group, width = fa._tile_size(count, extent, across, 1000, 64)
            finally:
                fa._WORKERS = saved
            seen = np.zeros((count, extent), dtype=np.int64)
            for i0, i1, lo, hi in fa._tiles(count, group, extent, width):
                seen[i0:i1, lo:hi] += 1
            assert (seen == 1).all()


def test_small_primes_single_limb() -> None:
    rng = np.random.default_rng(2)
    a, b = draw(rng, (4, 50), SMALL_P, "uniform"), draw(rng, (50, 6), SMALL_P, "top")
    np.testing.assert_array_equal(fa.matmul_mod(a, b, SMALL_P, limbs=1),
                                  big_matmul(a, b, SMALL_P))
