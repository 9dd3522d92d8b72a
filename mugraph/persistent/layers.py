"""The block graphs of a decoder layer, one function per custom kernel.

Every layer of a :class:`~mugraph.persistent.kernel.PersistentKernel` is made of the custom
kernels built here: ordinary mugraph μGraphs (``new_threadblock_graph`` ... ``customized``) that
the verifier, the renderer and the code generator understand like any other. They are written
for one token per step (decode at batch 1), where a projection is a matrix-vector product:

- a projection ``y = x @ W.T`` with the weight in PyTorch's ``(N, K)`` layout is the row-dot
  form ``reshape(reduction(mul(W_tile, x), 1))``: each block takes ``tile_n`` whole rows of W
  (contiguous in memory), multiplies them by the broadcast row ``x`` and sums along K;
- RMSNorm with epsilon is ``x / sqrt(mean(x²) + eps)`` with ``eps`` a (1, 1) input (mugraph's
  ``rms_norm`` has none), times the norm weight; it is recomputed by every block that needs the
  normalised row (K values), so a projection never waits for a separate norm kernel;
- attention over the KV cache is split FlashDecoding-style: ``attention_partials`` computes, for
  each KV head and each chunk of cached positions, ``sum(exp(s))`` and ``exp(s) @ V`` with an
  additive mask row (0 for positions before the current one, -inf after);
  ``attention_new_token`` does the same for the current token's own key and value and writes the
  (normalised, rotated) key and the value as two outputs that the persistent kernel places in
  the cache (the cache append); ``attention_combine`` adds the partial sums and divides.
  Partial sums carry no running maximum across kernels (as in the library's FlashDecoding
  form): scores above ~88 would overflow float32.
- RoPE is ``x * cos + rotate_half(x) * sin``, with ``rotate_half`` a (2r, 2r) signed
  permutation multiplying the rows of ``x`` viewed as halves (:func:`rotate`), so it stays
  inside the operator set with a product far smaller than ``x @ R`` by a (d, d) matrix.
- the MLP may be one kernel (:func:`rmsnorm_gate_up_down`): each block also multiplies its
  values of the hidden activation by the same rows of the transposed down weight and adds
  the product into an *accumulating* output (``new_output(..., accumulate=True)``), the
  down projection split over the intermediate dim; its readers add that row to the
  residual as they read it (``summed=`` of :func:`rmsnorm_linear` / :func:`linear_residual`,
  :func:`residual_sum` for any other);
- argmax is a two-stage maximum (``argmax_partials``, ``argmax_final``); the code generator of
  the persistent kernel tracks the position of the maximum beside its value
  (:mod:`mugraph.persistent.codegen`), the μGraph itself computes the maximum logit.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from mugraph.errors import ShapeError
from mugraph.ir.builder import KernelGraph, ThreadBlockGraph, new_threadblock_graph
from mugraph.ir.tensor import DTensor, STensor

BLOCK_DIM = (128, 1, 1)
REPLICATE = (-1, -1, -1)
ALONG_X_DIM1 = (1, -1, -1)
ALONG_X_DIM0 = (0, -1, -1)


def _require(ok: bool, layer: str, message: str) -> None:
    if not ok:
        raise ShapeError(f"{layer}: {message}")


def _divides(layer: str, what: str, size: int, parts: int) -> None:
    _require(size % parts == 0, layer, f"{what} ({size}) is not divisible by {parts}")


@dataclass(frozen=True)
class GemvTiles:
    """How a projection's output columns are split over blocks: ``tile_n`` columns each."""

    tile_n: int

    def grid(self, layer: str, n: int) -> tuple[int, int, int]:
        _divides(layer, "the output width", n, self.tile_n)
        return (n // self.tile_n, 1, 1)


# ---- building blocks inside one block graph --------------------------------------------------


def rms_normalize(tb: ThreadBlockGraph, x: STensor, eps: STensor) -> STensor:
    """``x / sqrt(mean(x², last dim) + eps)`` on a tile (rows are the leading dims)."""
    mean_sq = tb.mul_scalar(tb.reduction(tb.square(x), x.num_dims - 1), 1.0 / x.dims[-1])
    return tb.div(x, tb.sqrt(tb.add(mean_sq, eps)))


def row_dot(tb: ThreadBlockGraph, w: STensor, x: STensor) -> STensor:
    """``x @ w.T`` for a (1, K) row ``x`` and a (n, K) tile of weight rows: a (1, n) tile."""
    products = tb.reduction(tb.mul(w, x), 1)
    return tb.reshape(products, (1, w.dims[0]))


def rotate(tb: ThreadBlockGraph, x: STensor, cos: STensor, sin: STensor, pairs: STensor) -> STensor:
    """RoPE on the rows of ``x`` (r, d): ``x * cos + rotate_half(x) * sin``. Viewed as (2r, d/2),
    row ``2i`` of ``x`` is the first half of its row ``i`` and row ``2i + 1`` the second, so
    ``rotate_half`` (``cat(-x[d/2:], x[:d/2])`` per row) is ``pairs @ x`` with ``pairs`` from
    :func:`rotate_half_pairs`: a (2r, 2r) product where a (d, d) one (``x @ R``) would read and
    multiply a d x d matrix in every block."""
    rows, d = x.dims
    halves = tb.reshape(x, (2 * rows, d // 2))
    rotated = tb.reshape(tb.matmul(pairs, halves), (rows, d))
    return tb.add(tb.mul(x, cos), tb.mul(rotated, sin))


def rotate_half_pairs(rows: int) -> np.ndarray:
    """P (2 rows, 2 rows) with ``P @ h == [-h[1], h[0], -h[3], h[2], ...]``: on the halves of
    ``rows`` rows (see :func:`rotate`), transformers' ``rotate_half`` of each row."""
    p = np.zeros((2 * rows, 2 * rows), dtype=np.float32)
    for i in range(rows):
        p[2 * i, 2 * i + 1] = -1.0
        p[2 * i + 1, 2 * i] = 1.0
    return p


# ---- kernels ---------------------------------------------------------------------------------


def embedding_copy(g: KernelGraph, row: DTensor, tile: int) -> DTensor:
    """The embedding row of the current token (a dynamic view of the table), copied by
    ``hidden / tile`` blocks into the residual stream."""
    layer = "embed_layer"
    _require(row.num_dims == 2 and row.dims[0] == 1, layer, f"expects a (1, hidden) row, got {row}")
    _divides(layer, "the hidden size", row.dims[1], tile)
    tb = new_threadblock_graph((row.dims[1] // tile, 1, 1), BLOCK_DIM)
    t = tb.new_input(row, ALONG_X_DIM1, -1)
    tb.new_output(t, ALONG_X_DIM1)
    (out,) = g.customized([row], tb)
    return out


def _check_row(layer: str, x: DTensor, k: int | None = None) -> int:
    _require(
        x.num_dims == 2 and x.dims[0] == 1,
        layer,
        f"expects one token per step: an input of shape (1, K), got {list(x.dims)}",
    )
    if k is not None:
        _require(x.dims[1] == k, layer, f"input width {x.dims[1]} does not match K={k}")
    return x.dims[1]


def _check_weight(layer: str, name: str, w: DTensor, k: int) -> int:
    _require(
        w.num_dims == 2 and w.dims[1] == k,
        layer,
        f"{name} must be (N, {k}) (PyTorch's Linear layout), got {list(w.dims)}",
    )
    return w.dims[0]


def _check_norm(layer: str, norm: DTensor, k: int, eps: DTensor) -> None:
    _require(
        tuple(norm.dims) == (1, k),
        layer,
        f"the norm weight must be (1, {k}), got {list(norm.dims)}",
    )
    _require(tuple(eps.dims) == (1, 1), layer, f"eps must be a (1, 1) tensor, got {list(eps.dims)}")


def _check_summed(layer: str, summed: Sequence[DTensor], like: DTensor) -> None:
    for row in summed:
        _require(
            tuple(row.dims) == tuple(like.dims),
            layer,
            f"a summed row must be {list(like.dims)} like the row it adds to, got "
            f"{list(row.dims)}",
        )


def _add_rows(tb: ThreadBlockGraph, tile: STensor, rows: Sequence[DTensor], imap) -> STensor:
    """``tile`` plus the same tile (by ``imap``) of every row of ``rows``."""
    for row in rows:
        tile = tb.add(tile, tb.new_input(row, imap, -1))
    return tile


def rmsnorm_linear(
    g: KernelGraph,
    x: DTensor,
    norm: DTensor,
    eps: DTensor,
    w: DTensor,
    tiles: GemvTiles,
    summed: Sequence[DTensor] = (),
    materialize: bool = False,
    bias: DTensor | None = None,
) -> DTensor | tuple[DTensor, DTensor]:
    """``rmsnorm(x) * norm @ W.T (+ bias)``: each block normalises the whole row and takes
    ``tile_n`` rows of W (and the same ``tile_n`` values of ``bias``, a (1, N) row).
    ``summed``: rows added to ``x`` first (outputs summed over blocks, whose
    residual is ``x``: :func:`rmsnorm_gate_up_down`, :func:`attention_combine_projection`).
    ``materialize``: also write that sum, each block its slice of the row (the number of
    blocks must divide the row); returns ``(out, row)``."""
    layer = "rmsnorm_linear_layer"
    k = _check_row(layer, x)
    _check_norm(layer, norm, k, eps)
    _check_summed(layer, summed, x)
    n = _check_weight(layer, "weight_linear", w, k)
    if bias is not None:
        _require(
            tuple(bias.dims) == (1, n),
            layer,
            f"the bias must be (1, {n}) (one value per output), got {list(bias.dims)}",
        )
    grid = tiles.grid(layer, n)
    if materialize:
        _divides(layer, "the row it writes", k, grid[0])
    tb = new_threadblock_graph(grid, BLOCK_DIM)
    tx = tb.new_input(x, REPLICATE, -1)
    tn = tb.new_input(norm, REPLICATE, -1)
    te = tb.new_input(eps, REPLICATE, -1)
    tw = tb.new_input(w, ALONG_X_DIM0, -1)
    tx = _add_rows(tb, tx, summed, REPLICATE)
    xn = tb.mul(rms_normalize(tb, tx, te), tn)
    out_tile = row_dot(tb, tw, xn)
    if bias is not None:
        out_tile = tb.add(out_tile, tb.new_input(bias, ALONG_X_DIM1, -1))
    tb.new_output(out_tile, ALONG_X_DIM1)
    inputs = [x, norm, eps, w, *summed, *([bias] if bias is not None else [])]
    if materialize:
        part = _add_rows(tb, tb.new_input(x, ALONG_X_DIM1, -1), summed, ALONG_X_DIM1)
        tb.new_output(part, ALONG_X_DIM1)
        inputs += [x, *summed]
        out, row = g.customized(inputs, tb)
        return out, row
    (out,) = g.customized(inputs, tb)
    return out


def linear_residual(
    g: KernelGraph,
    x: DTensor,
    w: DTensor,
    residual: DTensor,
    tiles: GemvTiles,
    summed: Sequence[DTensor] = (),
) -> DTensor:
    """``x @ W.T + residual`` (the attention output projection, the MLP's down projection);
    ``summed``: rows added to ``residual`` (as in :func:`rmsnorm_linear`)."""
    layer = "linear_residual_layer"
    k = _check_row(layer, x)
    n = _check_weight(layer, "weight", w, k)
    _require(
        tuple(residual.dims) == (1, n),
        layer,
        f"the residual must be (1, {n}), got {list(residual.dims)}",
    )
    _check_summed(layer, summed, residual)
    tb = new_threadblock_graph(tiles.grid(layer, n), BLOCK_DIM)
    tx = tb.new_input(x, REPLICATE, -1)
    tw = tb.new_input(w, ALONG_X_DIM0, -1)
    tr = _add_rows(tb, tb.new_input(residual, ALONG_X_DIM1, -1), summed, ALONG_X_DIM1)
    tb.new_output(tb.add(row_dot(tb, tw, tx), tr), ALONG_X_DIM1)
    inputs = [x, w, residual, *summed]
    (out,) = g.customized(inputs, tb)
    return out


def linear_partial(g: KernelGraph, x: DTensor, w: DTensor, tiles: GemvTiles) -> DTensor:
    """``x @ W.T`` alone: one rank's share of a row-parallel projection before its all-reduce."""
    layer = "linear_layer"
    k = _check_row(layer, x)
    n = _check_weight(layer, "weight", w, k)
    tb = new_threadblock_graph(tiles.grid(layer, n), BLOCK_DIM)
    tx = tb.new_input(x, REPLICATE, -1)
    tw = tb.new_input(w, ALONG_X_DIM0, -1)
    tb.new_output(row_dot(tb, tw, tx), ALONG_X_DIM1)
    (out,) = g.customized([x, w], tb)
    return out


def _mlp_block(
    layer: str,
    x: DTensor,
    norm: DTensor,
    eps: DTensor,
    w_gate: DTensor,
    w_up: DTensor,
    tiles: GemvTiles,
    summed: Sequence[DTensor] = (),
) -> tuple[ThreadBlockGraph, STensor, STensor, STensor]:
    """The start the MLP's block graphs share, after checking their inputs: the grid over the
    intermediate dim (``tiles``), the RMS-normalised row ``xn`` and the block's gate and up
    weight rows (block inputs in the kernel's order: x, norm, eps, gate, up; then the
    caller's)."""
    k = _check_row(layer, x)
    _check_norm(layer, norm, k, eps)
    n = _check_weight(layer, "gate weight", w_gate, k)
    _require(
        tuple(w_up.dims) == (n, k),
        layer,
        f"the up weight must match the gate weight ({n}, {k}), got {list(w_up.dims)}",
    )
    tb = new_threadblock_graph(tiles.grid(layer, n), BLOCK_DIM)
    tx = tb.new_input(x, REPLICATE, -1)
    tn = tb.new_input(norm, REPLICATE, -1)
    te = tb.new_input(eps, REPLICATE, -1)
    tg = tb.new_input(w_gate, ALONG_X_DIM0, -1)
    tu = tb.new_input(w_up, ALONG_X_DIM0, -1)
    tx = _add_rows(tb, tx, summed, REPLICATE)
    return tb, tb.mul(rms_normalize(tb, tx, te), tn), tg, tu


def rmsnorm_gate_up(
    g: KernelGraph,
    x: DTensor,
    norm: DTensor,
    eps: DTensor,
    w_gate: DTensor,
    w_up: DTensor,
    tiles: GemvTiles,
) -> DTensor:
    """``silu(xn @ Wg.T) * (xn @ Wu.T)`` with ``xn`` the RMS-normalised row."""
    tb, xn, tg, tu = _mlp_block("mlp_layer", x, norm, eps, w_gate, w_up, tiles)
    gate = row_dot(tb, tg, xn)
    up = row_dot(tb, tu, xn)
    tb.new_output(tb.mul(tb.silu(gate), up), ALONG_X_DIM1)
    (out,) = g.customized([x, norm, eps, w_gate, w_up], tb)
    return out


def rmsnorm_gate_up_down(
    g: KernelGraph,
    x: DTensor,
    norm: DTensor,
    eps: DTensor,
    w_gate: DTensor,
    w_up: DTensor,
    w_down_t: DTensor,
    tiles: GemvTiles,
    summed: Sequence[DTensor] = (),
) -> DTensor:
    """The whole MLP but its residual in one kernel: ``(silu(xn @ Wg.T) * (xn @ Wu.T)) @ Wd.T``
    with ``xn`` the RMS-normalised row (of ``x`` plus the ``summed`` rows). Block ``i`` takes
    ``tile_n`` rows of the gate and up weights (``tile_n`` values of the hidden activation)
    and the same rows of ``w_down_t``
    (the down weight transposed: (intermediate, hidden), so a block's rows are contiguous), and
    adds its product with them into the (1, hidden) output (an accumulating output, which the
    persistent runtime keeps in float32): the down projection split over the intermediate dim,
    with no dependency level of its own.
    """
    layer = "mlp_layer"
    _require(
        tuple(w_down_t.dims) == tuple(w_gate.dims),
        layer,
        f"the transposed down weight must be {list(w_gate.dims)} like the gate weight, got "
        f"{list(w_down_t.dims)}",
    )
    _check_summed(layer, summed, x)
    tb, xn, tg, tu = _mlp_block(layer, x, norm, eps, w_gate, w_up, tiles, summed)
    td = tb.new_input(w_down_t, ALONG_X_DIM0, -1)
    gate = tb.reduction(tb.mul(tg, xn), 1)  # (tile_n, 1): a column of the block's values
    up = tb.reduction(tb.mul(tu, xn), 1)
    hidden = tb.mul(tb.silu(gate), up)
    tb.new_output(tb.reduction(tb.mul(td, hidden), 0), REPLICATE, accumulate=True)
    (out,) = g.customized([x, norm, eps, w_gate, w_up, *summed, w_down_t], tb)
    return out


def residual_sum(g: KernelGraph, x: DTensor, summed: Sequence[DTensor], tile: int) -> DTensor:
    """``x`` plus the ``summed`` rows in ``x``'s type, ``tile`` columns per block: a row that
    kernels with accumulating outputs left as several, for a reader that takes one."""
    layer = "mlp_layer"
    _check_row(layer, x)
    _check_summed(layer, summed, x)
    _divides(layer, "the hidden size", x.dims[1], tile)
    tb = new_threadblock_graph((x.dims[1] // tile, 1, 1), BLOCK_DIM)
    total = _add_rows(tb, tb.new_input(x, ALONG_X_DIM1, -1), summed, ALONG_X_DIM1)
    tb.new_output(total, ALONG_X_DIM1)
    (out,) = g.customized([x, *summed], tb)
    return out


@dataclass(frozen=True)
class AttentionShape:
    """Head counts and sizes of one attention layer (grouped-query attention)."""

    num_heads: int
    num_kv_heads: int
    head_dim: int
    max_seq: int
    chunk: int  # cached positions per partial block

    @property
    def group(self) -> int:
        return self.num_heads // self.num_kv_heads

    @property
    def num_chunks(self) -> int:
        return self.max_seq // self.chunk

    @property
    def scale(self) -> float:
        return 1.0 / math.sqrt(self.head_dim)

    def check(self, layer: str) -> None:
        _divides(layer, "num_heads", self.num_heads, self.num_kv_heads)
        _divides(layer, "the cache length", self.max_seq, self.chunk)
        _require(self.head_dim % 2 == 0, layer, f"head_dim {self.head_dim} must be even (RoPE)")


@dataclass(frozen=True)
class HeadInputs:
    """The per-head tensors shared by the attention kernels (rope rows, norms)."""

    cos: DTensor  # (1, head_dim): a dynamic view of the cos table at the current position
    sin: DTensor
    rot_q: DTensor  # (2 group, 2 group): rotate_half of a KV head's query rows (rotate_half_pairs)
    rot_k: DTensor  # (2, 2): the same for its one key row
    eps: DTensor  # (1, 1)
    q_norm: DTensor | None  # (1, head_dim) per-head RMSNorm weights (Qwen3), or None
    k_norm: DTensor | None

    def tensors(self) -> list[DTensor]:
        extra = [t for t in (self.q_norm, self.k_norm) if t is not None]
        return [self.cos, self.sin, self.rot_q, self.rot_k, self.eps, *extra]


class _HeadOps:
    """Adds the per-head inputs to a block graph and prepares queries and keys with them."""

    def __init__(self, tb: ThreadBlockGraph, heads: HeadInputs) -> None:
        self.tb = tb
        self.cos = tb.new_input(heads.cos, REPLICATE, -1)
        self.sin = tb.new_input(heads.sin, REPLICATE, -1)
        self.rot_q = tb.new_input(heads.rot_q, REPLICATE, -1)
        self.rot_k = tb.new_input(heads.rot_k, REPLICATE, -1)
        self.eps = tb.new_input(heads.eps, REPLICATE, -1)
        self.q_norm = tb.new_input(heads.q_norm, REPLICATE, -1) if heads.q_norm else None
        self.k_norm = tb.new_input(heads.k_norm, REPLICATE, -1) if heads.k_norm else None

    def prepare(self, x: STensor, norm: STensor | None, pairs: STensor) -> STensor:
        """Per-head RMSNorm (when the model has one), then RoPE."""
        if norm is not None:
            x = self.tb.mul(rms_normalize(self.tb, x, self.eps), norm)
        return rotate(self.tb, x, self.cos, self.sin, pairs)


def _check_heads(layer: str, shape: AttentionShape, heads: HeadInputs) -> None:
    d = shape.head_dim
    for name, t in (("cos", heads.cos), ("sin", heads.sin)):
        _require(tuple(t.dims) == (1, d), layer, f"{name} must be (1, {d}), got {list(t.dims)}")
    _require(d % 2 == 0, layer, f"head_dim {d} must be even (RoPE)")
    for name, t, rows in (("rot_q", heads.rot_q, shape.group), ("rot_k", heads.rot_k, 1)):
        want = (2 * rows, 2 * rows)
        _require(tuple(t.dims) == want, layer, f"{name} must be {list(want)}, got {list(t.dims)}")
    for name, t in (("q_norm", heads.q_norm), ("k_norm", heads.k_norm)):
        if t is not None:
            _require(tuple(t.dims) == (1, d), layer, f"{name} must be (1, {d}), got {list(t.dims)}")


def attention_partials(
    g: KernelGraph,
    q: DTensor,
    k_cache_t: DTensor,
    v_cache: DTensor,
    mask: DTensor,
    heads: HeadInputs,
    shape: AttentionShape,
) -> tuple[DTensor, DTensor]:
    """Per (KV head, chunk of cached positions): ``exp(s) @ V`` and ``sum(exp(s))``.

    ``k_cache_t`` is the key cache viewed transposed, (kv_heads * head_dim, max_seq);
    ``v_cache`` is (max_seq, kv_heads * head_dim); ``mask`` is the (1, max_seq) additive mask
    row of the current position. Outputs: (kv_heads * group, chunks * head_dim) partial
    numerators and (kv_heads * group, chunks) partial denominators.
    """
    layer = "attention_layer"
    d, h, gq, c = shape.head_dim, shape.num_kv_heads, shape.group, shape.chunk
    _require(
        tuple(q.dims) == (1, shape.num_heads * d), layer, f"q must be (1, {shape.num_heads * d})"
    )
    _require(
        tuple(k_cache_t.dims) == (h * d, shape.max_seq), layer, "key cache has the wrong shape"
    )
    _require(
        tuple(v_cache.dims) == (shape.max_seq, h * d), layer, "value cache has the wrong shape"
    )
    _require(tuple(mask.dims) == (1, shape.max_seq), layer, f"mask must be (1, {shape.max_seq})")
    _check_heads(layer, shape, heads)
    tb = new_threadblock_graph((h, shape.num_chunks, 1), BLOCK_DIM)
    tq = tb.new_input(q, ALONG_X_DIM1, -1)
    tk = tb.new_input(k_cache_t, (0, 1, -1), -1)
    tv = tb.new_input(v_cache, (1, 0, -1), -1)
    tm = tb.new_input(mask, (-1, 1, -1), -1)
    ops = _HeadOps(tb, heads)
    qh = ops.prepare(tb.reshape(tq, (gq, d)), ops.q_norm, ops.rot_q)
    scores = tb.add(tb.mul_scalar(tb.matmul(qh, tk), shape.scale), tm)
    e = tb.exp(scores)
    tb.new_output(tb.matmul(e, tv), (0, 1, -1))
    tb.new_output(tb.reduction(e, 1), (0, 1, -1))
    o_part, l_part = g.customized([q, k_cache_t, v_cache, mask, *heads.tensors()], tb)
    del c
    return o_part, l_part


def attention_new_token(
    g: KernelGraph,
    q: DTensor,
    k: DTensor,
    v: DTensor,
    heads: HeadInputs,
    shape: AttentionShape,
) -> tuple[DTensor, DTensor, DTensor, DTensor]:
    """The current token's own term per KV head, and its key and value for the cache.

    Outputs: numerators (kv_heads * group, head_dim), denominators (kv_heads * group, 1), the
    prepared key row and the value row (1, kv_heads * head_dim) — the last two are placed at
    the current position of the caches by the persistent kernel.
    """
    layer = "attention_layer"
    d, h, gq = shape.head_dim, shape.num_kv_heads, shape.group
    for name, t in (("k", k), ("v", v)):
        _require(
            tuple(t.dims) == (1, h * d), layer, f"{name} must be (1, {h * d}), got {list(t.dims)}"
        )
    _check_heads(layer, shape, heads)
    tb = new_threadblock_graph((h, 1, 1), BLOCK_DIM)
    tq = tb.new_input(q, ALONG_X_DIM1, -1)
    tk = tb.new_input(k, ALONG_X_DIM1, -1)
    tv = tb.new_input(v, ALONG_X_DIM1, -1)
    ops = _HeadOps(tb, heads)
    qh = ops.prepare(tb.reshape(tq, (gq, d)), ops.q_norm, ops.rot_q)
    kh = ops.prepare(tk, ops.k_norm, ops.rot_k)
    score = tb.mul_scalar(tb.reduction(tb.mul(qh, kh), 1), shape.scale)
    e = tb.exp(score)
    tb.new_output(tb.mul(e, tv), ALONG_X_DIM0)
    tb.new_output(e, ALONG_X_DIM0)
    tb.new_output(kh, ALONG_X_DIM1)
    tb.new_output(tv, ALONG_X_DIM1)
    outs = g.customized([q, k, v, *heads.tensors()], tb)
    return outs[0], outs[1], outs[2], outs[3]


def attention_combine(
    g: KernelGraph,
    o_part: DTensor,
    l_part: DTensor,
    o_new: DTensor,
    l_new: DTensor,
    shape: AttentionShape,
    per_query_head: bool = True,
) -> DTensor:
    """``(sum of numerators) / (sum of denominators)`` per head: a (1, heads * head_dim) row,
    one block per query head (``per_query_head``) or per KV head (its group's heads)."""
    d, gq = shape.head_dim, shape.group
    rows = 1 if per_query_head else gq  # query heads a block combines
    tb = new_threadblock_graph((shape.num_kv_heads * gq // rows, 1, 1), BLOCK_DIM,
                               shape.num_chunks)
    combined = _combined(tb, (o_part, l_part, o_new, l_new), ALONG_X_DIM0)
    tb.new_output(tb.reshape(combined, (1, rows * d)), ALONG_X_DIM1)
    (out,) = g.customized([o_part, l_part, o_new, l_new], tb)
    return out


def _combined(tb: ThreadBlockGraph, parts: tuple[DTensor, ...], imap) -> STensor:
    """(sum of numerators) / (sum of denominators) of a block's heads: the partial sums
    (``o_part``, ``l_part``, over the for-loop of chunks) and the current token's term
    (``o_new``, ``l_new``), tiled by ``imap`` (block inputs in that order)."""
    o_part, l_part, o_new, l_new = parts
    to = tb.new_input(o_part, imap, 1)
    tl_ = tb.new_input(l_part, imap, 1)
    ton = tb.new_input(o_new, imap, -1)
    tln = tb.new_input(l_new, imap, -1)
    num = tb.add(tb.forloop_accum(to), ton)
    den = tb.add(tb.forloop_accum(tl_), tln)
    return tb.div(num, den)


def attention_output_projection(
    g: KernelGraph,
    o_part: DTensor,
    l_part: DTensor,
    o_new: DTensor,
    l_new: DTensor,
    shape: AttentionShape,
    w: DTensor,
    residual: DTensor,
    tiles: GemvTiles,
) -> DTensor:
    """``combine(partials) @ W.T + residual`` in one kernel: every block adds up the partial
    sums of all heads (the same for every block: a persistent task does it once for all its
    blocks) and multiplies the attention row by its rows of W. One dependency level fewer than
    ``attention_combine`` followed by ``linear_residual``."""
    layer = "linear_residual_layer"
    width = shape.num_heads * shape.head_dim
    n = _check_weight(layer, "weight", w, width)
    _require(tuple(residual.dims) == (1, n), layer, f"the residual must be (1, {n})")
    tb = new_threadblock_graph(tiles.grid(layer, n), BLOCK_DIM, shape.num_chunks)
    combined = _combined(tb, (o_part, l_part, o_new, l_new), REPLICATE)
    tw = tb.new_input(w, ALONG_X_DIM0, -1)
    tr = tb.new_input(residual, ALONG_X_DIM1, -1)
    attn = tb.reshape(combined, (1, width))
    tb.new_output(tb.add(row_dot(tb, tw, attn), tr), ALONG_X_DIM1)
    (out,) = g.customized([o_part, l_part, o_new, l_new, w, residual], tb)
    return out


def attention_combine_projection(
    g: KernelGraph,
    parts: tuple[DTensor, DTensor, DTensor, DTensor],
    shape: AttentionShape,
    w: DTensor,
    tiles: GemvTiles,
) -> DTensor:
    """``combine(parts) @ W.T`` split over the KV heads (``parts``: ``o_part``, ``l_part``,
    ``o_new``, ``l_new`` of :func:`attention_combine`): block ``(g, j)`` adds up the
    partial sums of KV head ``g``'s query heads only, and multiplies that part of the
    attention row by the same columns of ``tile_n`` rows ``j`` of W; the blocks of the heads
    add their products into the (1, N) output (accumulating over grid x, unless there is one
    KV head). The combination and the output projection make one dependency level, and no
    block reads every head's partials (as :func:`attention_output_projection`'s do). The
    residual is its readers' (a summed row of theirs)."""
    layer = "linear_residual_layer"
    d, h, gq = shape.head_dim, shape.num_kv_heads, shape.group
    n = _check_weight(layer, "weight", w, shape.num_heads * d)
    _divides(layer, "the output width", n, tiles.tile_n)
    tb = new_threadblock_graph((h, n // tiles.tile_n, 1), BLOCK_DIM, shape.num_chunks)
    combined = _combined(tb, parts, ALONG_X_DIM0)
    tw = tb.new_input(w, (1, 0, -1), -1)  # (tile_n, group * head_dim): head g's columns
    attn = tb.reshape(combined, (1, gq * d))
    # one KV head: nothing to sum, the blocks of the output's columns write it
    tb.new_output(row_dot(tb, tw, attn), (-1, 1, -1), accumulate=h > 1)
    (out,) = g.customized([*parts, w], tb)
    return out


def argmax_partials(g: KernelGraph, logits: DTensor, parts: int) -> DTensor:
    """The maximum of each of ``parts`` slices of the logits row: (1, parts)."""
    layer = "argmax_layer"
    _check_row(layer, logits)
    _divides(layer, "the vocabulary size", logits.dims[1], parts)
    tb = new_threadblock_graph((parts, 1, 1), BLOCK_DIM)
    t = tb.new_input(logits, ALONG_X_DIM1, -1)
    tb.new_output(tb.reduction_max(t, 1), ALONG_X_DIM1)
    (out,) = g.customized([logits], tb)
    return out


def argmax_final(g: KernelGraph, partial_max: DTensor) -> DTensor:
    """The maximum of the partial maxima: (1, 1), the largest logit."""
    tb = new_threadblock_graph((1, 1, 1), BLOCK_DIM)
    t = tb.new_input(partial_max, REPLICATE, -1)
    tb.new_output(tb.reduction_max(t, 1), REPLICATE)
    (out,) = g.customized([partial_max], tb)
    return out


def all_reduce_sum(g: KernelGraph, shares: list[DTensor], residual: DTensor | None, tile: int):
    """``sum(shares) (+ residual)``: the arithmetic of a tensor-parallel all-reduce, tile by tile.

    Each share is one rank's partial result (on a real multi-GPU run, a peer rank's buffer
    read through its address); the block graph is the same μGraph on every rank.
    """
    layer = "allreduce_layer"
    first = shares[0]
    _check_row(layer, first)
    for s in shares[1:]:
        _require(s.dims == first.dims, layer, f"shares differ in shape: {s} vs {first}")
    _divides(layer, "the width", first.dims[1], tile)
    tb = new_threadblock_graph((first.dims[1] // tile, 1, 1), BLOCK_DIM)
    tiles_ = [tb.new_input(s, ALONG_X_DIM1, -1) for s in shares]
    total = tiles_[0]
    for t in tiles_[1:]:
        total = tb.add(total, t)
    inputs = list(shares)
    if residual is not None:
        total = tb.add(total, tb.new_input(residual, ALONG_X_DIM1, -1))
        inputs.append(residual)
    tb.new_output(total, ALONG_X_DIM1)
    (out,) = g.customized(inputs, tb)
    return out
