r"""Exact matrix products modulo a prime m < 2^31 with float64 GEMMs, tile by tile.

The law: for canonical operands (``0 <= v < m``; int64, or float64 holding such integers)
:func:`product_tile` followed by :func:`finish_tile` writes exactly ``(a @ b) mod m``,
canonical, for its tile of the output.  Every float64 value that is formed is an integer of
absolute value at most ``2^53 - 2``, so no operation rounds: the result is the same whatever
order BLAS sums in (FMA or not), and the same as any other exact method gives.
:mod:`mugraph.semantics.field_arith` cuts a product into tiles and runs them on its threads.

Digits
------
The operand with fewer elements (``S``) is split into L balanced base-2^s digits with
``s = ceil((bits(m-1) + 1) / L)``, every digit ``|d| <= D = 2^(s-1)``; the other operand
(``W``) is used as it is (``0 <= w < m``).  A GEMM of digits and ``W`` over a reduction of
length k has partial sums bounded by ``k·D·(m-1)``: exact while that is at most ``2^53 - 2``;
the longest such k is the plan's *chunk* (:class:`GemmPlan`).  A longer reduction is cut into
chunks, each chunk's sum reduced by :func:`fred_` and the reduced sums added.

Where the limbs go (:class:`GemmLayout`)
----------------------------------------
* Along the free dim (``stack_k=False``): the L digit matrices are stacked along S's free dim,
  one GEMM gives every ``T_l = D_l @ W`` (an output L times as large), and the limbs are
  combined by Horner's rule ``r <- r·2^s + T_l (mod m)``.  Cheap when the output is small
  (a few rows against a large weight).
* Along the reduction (``stack_k=True``): ``Σ_l 2^(s·l)·(D_l @ W) = Σ_l D_l @ W_l`` with
  ``W_l = 2^(s·l)·W mod m`` (canonical, so the same bound holds), i.e. one GEMM
  ``[D_0 | D_1 | ...] @ [W_0; W_1; ...]`` over a reduction L times as long whose sum *is* the
  product: no L-fold output and no Horner.  Costs L-1 scaled copies of W; cheap when the
  output is much larger than W (``Q @ K^T`` of attention: a short reduction, a large output).

Both do the same multiply-adds.  :func:`choose_layout` picks the number of limbs and the layout
with a small cost model; any choice gives the same values.

Reductions
----------
:func:`fred_` maps ``|x| <= 2^53 - 2`` into ``[-m-2, m+2]`` (congruent) and :func:`mod_exact_`
maps ``|x| <= 2^50`` to the canonical ``[0, m)``, both in a handful of float64 passes; a
tile's result is converted to int64 and made canonical by :func:`canon_int_into` in work
arrays, then written to the output once.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

F64_EXACT = (1 << 53) - 2  # |partial sums| bound of an exact GEMM (see fred_)

__all__ = [
    "F64_EXACT",
    "GemmLayout",
    "GemmPlan",
    "choose_layout",
    "digits",
    "finish_tile",
    "fred_",
    "gemm_plan",
    "gemm_ready",
    "canon_int_",
    "canon_int_into",
    "mod_exact_",
    "product_tile",
    "scaled_stack",
    "TileBudget",
    "TileScratch",
]


# ---------------------------------------------------------------------------------------------
# Plans
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class GemmPlan:
    """How a product modulo ``modulus`` is cut into ``limbs`` digits.

    ``digit_bits`` is s (0 when limbs = 1: no split), ``digit_bound`` D (every digit has
    |d| <= D; with no split D = m - 1) and ``chunk`` the longest reduction one float64 GEMM
    computes exactly: the largest k with ``k · D · (m-1) <= 2^53 - 2``.
    """

    modulus: int
    limbs: int
    digit_bits: int
    digit_bound: int
    chunk: int


def gemm_plan(modulus: int, limbs: int) -> GemmPlan:
    """The exactness plan for ``limbs`` balanced digits (chunk 0: that many limbs is unusable)."""
    if limbs == 1:
        bits, bound = 0, modulus - 1
    else:
        bits = -(-((modulus - 1).bit_length() + 1) // limbs)
        bound = 1 << (bits - 1)
    return GemmPlan(modulus, limbs, bits, bound, F64_EXACT // (bound * (modulus - 1)))


@dataclass(frozen=True)
class GemmLayout:
    """A plan, which operand is split (``split_left``: the left one, x of x @ y) and where
    its limbs go (``stack_k``: along the reduction, W scaled; else along S's free dim)."""

    plan: GemmPlan
    split_left: bool
    stack_k: bool

    @property
    def reduction_factor(self) -> int:
        """How much longer the GEMM's reduction is than the product's."""
        return self.plan.limbs if self.stack_k else 1

    def chunks(self, k: int) -> int:
        """Exact chunks of a reduction of length k (after stacking)."""
        return -(-(k * self.reduction_factor) // self.plan.chunk)


@dataclass(frozen=True)
class TileBudget:
    """How a caller cuts a product into tiles: about ``out`` GEMM outputs and ``made`` digits
    (and scaled copies) per tile, the tiles run on ``threads`` threads."""

    out: int
    made: int
    threads: int = 1


# Cost model (ns) for the layout; measured on the 2-core AMD EPYC VM this project is developed
# on.  It only picks among exact methods: a wrong guess costs time, not values.
_NS_PER_MAC = 0.06  # float64 GEMM, per multiply-add
_NS_PER_PASS = 0.3  # one elementwise float64 pass over cache-resident data, per element
_NS_PER_BLAS_CALL = 3_000.0  # one GEMM of one batch item (NumPy calls BLAS item by item)
_NS_PER_TILE_STEP = 12_000.0  # Python work of one tile and chunk (a GEMM call, fred_, add):
# it holds the GIL, so it does not shrink with more threads
_FINISH_PASSES = 8  # the int64 conversion and canon_int_into of an output element
_HORNER_PASSES = 6  # fred_, scale and add, per extra limb
_CHUNK_PASSES = 5  # fred_ and add, per chunk and GEMM output element
_SCALE_PASSES = 10  # a scaled copy: mod_exact_, its store, and reading it, per W element


def choose_layout(
    m: int,
    limbs: int | None,
    batch: int,
    rows: int,
    k: int,
    cols: int,
    split_left: bool,
    budget: TileBudget,
) -> GemmLayout:
    """The cheapest exact layout by the cost model (``limbs`` forces the number of digits)
    for ``batch`` products of ``rows × k`` by ``k × cols`` cut into tiles by ``budget``."""
    layouts = [GemmLayout(plan, split_left, stack_k)
               for plan in (gemm_plan(m, n) for n in ((limbs,) if limbs else (1, 2, 3, 4)))
               if plan.chunk >= 1
               for stack_k in ((False, True) if plan.limbs > 1 else (False,))]
    if not layouts:
        raise ValueError(f"{limbs} limb(s) cannot multiply exactly modulo {m}" if limbs
                         else f"modulus {m} is too large for exact float64 GEMM")
    return min(layouts, key=lambda lay: _layout_cost(lay, batch, rows, k, cols, budget))


def _layout_cost(
    layout: GemmLayout, batch: int, rows: int, k: int, cols: int, budget: TileBudget
) -> float:
    """Estimated nanoseconds for the product with ``layout``: the work spread over the
    threads, plus the Python work of every tile and chunk (serial: it holds the GIL) once
    per thread waiting on it."""
    n = layout.plan.limbs
    outs = batch * rows * cols
    s_elems = batch * k * (rows if layout.split_left else cols)
    w_elems = batch * k * (cols if layout.split_left else rows)
    chunks = layout.chunks(k)
    gemm_outs = outs if layout.stack_k else n * outs
    passes = _FINISH_PASSES * outs + (3 * n + 1) * s_elems
    if chunks > 1:
        passes += _CHUNK_PASSES * chunks * gemm_outs
    passes += (n - 1) * (_SCALE_PASSES * w_elems if layout.stack_k else _HORNER_PASSES * outs)
    made = n * (s_elems + (w_elems if layout.stack_k else 0))
    tiles = max(1, -(-gemm_outs // max(1, budget.out)), -(-made // max(1, budget.made)))
    work = n * outs * k * _NS_PER_MAC + passes * _NS_PER_PASS
    work += chunks * batch * _NS_PER_BLAS_CALL
    return work + budget.threads * chunks * tiles * _NS_PER_TILE_STEP


# ---------------------------------------------------------------------------------------------
# Exact reductions of integer-valued float64 arrays
# ---------------------------------------------------------------------------------------------


def fred_(a: np.ndarray, m: int, scratch: np.ndarray | None = None) -> np.ndarray:
    """In place: a ← a - trunc(a·(1/m))·m for integer-valued float64 |a| <= 2^53 - 2.

    The computed quotient is within 2/m of a/m (two roundings of relative error 2^-53 on a
    value below 2^53/m), so trunc() is the true truncated quotient or off by one only when a/m
    lies within 2/m of an integer; then |t·m| <= |a| + 2 <= 2^53, so t·m and a - t·m are exact
    integers.  The result lies in [-m-2, m+2] and is congruent to a.  ``scratch``: a float64
    array of a's shape to use (else one is allocated).
    """
    t = np.multiply(a, 1.0 / m, out=scratch)
    np.trunc(t, out=t)
    t *= m
    a -= t
    return a


def canon_int_(x: np.ndarray, m: int, scratch: np.ndarray) -> np.ndarray:
    """In place: x ← x mod m in [0, m) (floor) for an int64 array, through a (libdivide)
    floor division into ``scratch`` (an int64 array of x's shape)."""
    np.floor_divide(x, m, out=scratch)
    scratch *= m
    x -= scratch
    return x


def canon_int_into(x: np.ndarray, m: int, out: np.ndarray, scratch: np.ndarray) -> None:
    """``out`` ← x mod m in [0, m) (floor) for an int64 array ``x`` (left unchanged), through
    a floor division into ``scratch``: computed in the (cache-resident) work arrays and
    written to ``out`` once, instead of reading and writing ``out`` (a strided tile of a large
    result) three times as :func:`canon_int_` on it would."""
    np.floor_divide(x, m, out=scratch)
    scratch *= m
    np.subtract(x, scratch, out=out)


def mod_exact_(a: np.ndarray, m: int, scratch: np.ndarray | None = None) -> np.ndarray:
    """In place: a ← a mod m in [0, m) for integer-valued float64 |a| <= 2^50.

    With ``y = a + 1/2`` (exact: 52 bits), ``y/m = n + f`` where n = floor(a/m) and
    ``f = (a mod m + 1/2)/m`` lies in ``[1/(2m), 1 - 1/(2m)]``.  The computed ``y·fl(1/m)``
    has relative error below 2^-52 + 2^-105, so absolute error below ``2^50·2^-51.9/m <
    1/(2m)``: it lies strictly between n and n + 1 and its floor is exactly n.  Then
    ``|n·m| < 2^51`` and ``a - n·m`` (in [0, m)) are exact.  ``scratch``: a float64 array of
    a's shape to use (else one is allocated).
    """
    t = np.add(a, 0.5, out=scratch)
    t *= 1.0 / m
    np.floor(t, out=t)
    t *= m
    a -= t
    return a


# ---------------------------------------------------------------------------------------------
# Operands
# ---------------------------------------------------------------------------------------------


class TileScratch:
    """Float64 work arrays of one thread, reused from tile to tile (fresh large arrays would
    cost page faults on every tile): taken as views of the first ``n`` elements."""

    def __init__(self) -> None:
        self._arrays: dict[str, np.ndarray] = {}

    def get(self, name: str, shape: tuple[int, ...], dtype: type = np.float64) -> np.ndarray:
        n = math.prod(shape)
        held = self._arrays.get(name)
        if held is None or held.size < n or held.dtype != dtype:
            held = self._arrays[name] = np.empty(n, dtype=dtype)
        return held[:n].reshape(shape)

    def get_int(self, name: str, shape: tuple[int, ...]) -> np.ndarray:
        return self.get(name, shape, np.int64)

    def trim(self, max_bytes: int) -> None:
        """Let every array go when together they hold more than ``max_bytes``."""
        if sum(a.nbytes for a in self._arrays.values()) > max_bytes:
            self._arrays = {}


def _stack_axis(layout: GemmLayout) -> int:
    """The axis of the digits array along which the limbs are stacked."""
    return -2 if layout.split_left != layout.stack_k else -1


def _limb_block(arr: np.ndarray, i: int, size: int, axis: int) -> np.ndarray:
    """Block i (of length ``size``) of ``arr`` along ``axis`` (-2 or -1)."""
    if axis == -2:
        return arr[..., i * size : (i + 1) * size, :]
    return arr[..., i * size : (i + 1) * size]


def digits(s: np.ndarray, layout: GemmLayout, scratch: TileScratch | None = None) -> np.ndarray:
    """The balanced digits of ``s`` (canonical, int64 or float64) as one float64 array,
    limb-stacked (in ``scratch`` when given).

    Adding ``offset = Σ_{i<L-1} 2^(s-1)·2^(s·i)`` first turns balanced digits into plain ones:
    digit i is ``((s + offset) >> s·i) & (2^s - 1)) - 2^(s-1)`` (in [-2^(s-1), 2^(s-1))), the
    top digit ``(s + offset) >> s·(L-1)`` (in [0, 2^(s-1)] since s·L >= bits(m-1) + 1), and
    ``Σ_i digit_i·2^(s·i) = s``.  Limb i is block i along :func:`_stack_axis`: the rows (x's
    free dim) or columns (y's free dim) for limbs along the free dim, the reduction otherwise.
    """
    scratch = TileScratch() if scratch is None else scratch
    plan = layout.plan
    limbs, bits = plan.limbs, plan.digit_bits
    axis = _stack_axis(layout)
    shape = list(s.shape)
    shape[axis] *= limbs
    out = scratch.get("digits", tuple(shape))
    if limbs == 1:
        np.copyto(out, s, casting="unsafe")
        return out
    size = s.shape[axis]
    half = 1 << (bits - 1)
    t, u = scratch.get_int("digits.t", s.shape), scratch.get_int("digits.u", s.shape)
    np.copyto(t, s, casting="unsafe")  # float64 holding integers < 2^31: exact
    t += sum(half << (bits * i) for i in range(limbs - 1))
    for i in range(limbs):
        target = _limb_block(out, i, size, axis)
        if i == limbs - 1:
            np.right_shift(t, bits * i, out=target, casting="unsafe")
        else:
            np.right_shift(t, bits * i, out=u)
            u &= (1 << bits) - 1
            np.subtract(u, half, out=target, casting="unsafe")
    return out


def scaled_stack(
    w: np.ndarray, layout: GemmLayout, scratch: TileScratch | None = None
) -> np.ndarray:
    """``[W; 2^s·W; 2^(2s)·W; ...] mod m`` stacked along W's reduction axis, float64, canonical
    (for limbs along the reduction: block l pairs with digit l; in ``scratch`` when given).

    Each copy is the previous one times 2^s (< 2^31·2^16 = 2^47), reduced by
    :func:`mod_exact_`: exact."""
    scratch = TileScratch() if scratch is None else scratch
    plan = layout.plan
    axis = -2 if layout.split_left else -1
    size = w.shape[axis]
    shape = list(w.shape)
    shape[axis] *= plan.limbs
    out = scratch.get("scaled", tuple(shape))
    np.copyto(_limb_block(out, 0, size, axis), w, casting="unsafe")
    scale = float(1 << plan.digit_bits)
    tmp = scratch.get("scaled.tmp", w.shape)
    for i in range(1, plan.limbs):
        block = _limb_block(out, i, size, axis)
        np.multiply(_limb_block(out, i - 1, size, axis), scale, out=block)
        mod_exact_(block, plan.modulus, tmp)
    return out


def _blasable(a: np.ndarray) -> bool:
    """Whether NumPy hands the matrices of this float64 array (its last two axes) to BLAS as
    they are (one unit stride, the other a multiple of it at least as long as a row or a
    column); else matmul would use its slow loop."""
    if a.dtype != np.float64 or a.ndim < 2:
        return False
    (s0, s1), (n0, n1), item = a.strides[-2:], a.shape[-2:], a.itemsize
    if s1 == item and s0 % item == 0 and s0 >= item * max(1, n1):
        return True
    return s0 == item and s1 % item == 0 and s1 >= item * max(1, n0)


def gemm_ready(a: np.ndarray, scratch: TileScratch) -> np.ndarray:
    """A tile (matrices along the last two axes) as a float64 array BLAS takes as it is:
    ``a`` itself when it already is one, else a contiguous float64 copy in ``scratch``
    (int64 values < 2^31 convert exactly)."""
    if _blasable(a):
        return a
    out = scratch.get("operand", a.shape)
    np.copyto(out, a, casting="unsafe")
    return out


# ---------------------------------------------------------------------------------------------
# One tile
# ---------------------------------------------------------------------------------------------


def product_tile(
    a: np.ndarray, b: np.ndarray, plan: GemmPlan, scratch: TileScratch
) -> tuple[np.ndarray, int]:
    """``a @ b`` (float64 stacks of matrices, BLAS-ready, one of digits and one canonical) as
    float64 sums congruent to the product (in ``scratch``), and a bound on their absolute
    values.

    One GEMM per exact chunk of the reduction; with several chunks each chunk's sum is
    reduced by :func:`fred_` (into [-m-2, m+2]) and the reduced sums are added."""
    m, k = plan.modulus, a.shape[-1]
    shape = (*a.shape[:-1], b.shape[-1])
    total = scratch.get("total", shape)
    if k <= plan.chunk:
        np.matmul(a, b, out=total)
        return total, k * plan.digit_bound * (m - 1)
    tmp, part = scratch.get("tmp", shape), scratch.get("part", shape)
    np.matmul(a[..., : plan.chunk], b[..., : plan.chunk, :], out=total)
    fred_(total, m, tmp)
    for c0 in range(plan.chunk, k, plan.chunk):
        c1 = min(k, c0 + plan.chunk)
        np.matmul(a[..., c0:c1], b[..., c0:c1, :], out=part)
        total += fred_(part, m, tmp)
    return total, -(-k // plan.chunk) * (m + 2)


def finish_tile(
    total: np.ndarray, bound: int, layout: GemmLayout, out: np.ndarray, scratch: TileScratch
) -> None:
    """``out`` (an int64 tile) ← the canonical product from :func:`product_tile`'s sums.

    Limbs along the free dim: the L blocks ``T_l`` of ``total`` along the stacking axis are
    combined by Horner's rule ``r ← fred(r)·2^s + T_l`` (|r| <= (m+2)·2^s + bound, within
    2^53 - 2, else ``T_l`` is reduced first).  Then ``r`` (or the stacked sum itself), an
    integer below 2^53 in absolute value, is converted to int64 (exact) and brought to [0, m)
    by :func:`canon_int_into`, which writes ``out``."""
    plan, m = layout.plan, layout.plan.modulus
    acc = total
    if not layout.stack_k and plan.limbs > 1:
        axis = _stack_axis(layout)
        size = total.shape[axis] // plan.limbs
        parts = [_limb_block(total, i, size, axis) for i in range(plan.limbs)]
        scale = float(1 << plan.digit_bits)
        reduce_low = (m + 2) * (1 << plan.digit_bits) + bound > F64_EXACT
        acc = parts[-1]
        tmp = scratch.get("tmp", acc.shape)
        for low in reversed(parts[:-1]):
            fred_(acc, m, tmp)
            acc *= scale
            acc += fred_(low, m, tmp) if reduce_low else low
    whole = scratch.get_int("whole", acc.shape)
    np.copyto(whole, acc, casting="unsafe")  # |acc| <= 2^53 - 2: exact
    canon_int_into(whole, m, out, scratch.get_int("quotient", acc.shape))

