"""Known-good μGraphs written by hand with the builder, each beside its naive program.

They are test cases for every later step (the verifier must accept them, the search should
find them or better, code generation must compile them) and upper bounds for the benchmarks.
Each :class:`Workload` builds both graphs from a dict of sizes; ``small`` sizes run in
milliseconds on the CPU, ``suite`` sizes are those of ``benchmarks/SUITE.md`` at b=1.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from mugraph.dtypes import DType, float16
from mugraph.errors import ShapeError
from mugraph.ir.builder import KernelGraph, new_kernel_graph, new_threadblock_graph

Sizes = dict[str, int]


@dataclass(frozen=True)
class Workload:
    """A program in its naive form and a hand-written μGraph computing the same function."""

    name: str
    description: str
    naive: Callable[..., KernelGraph]
    optimized: Callable[..., KernelGraph]
    small: Sizes
    suite: Sizes
    extra: dict[str, Sizes] = field(default_factory=dict)

    def __post_init__(self) -> None:
        # both builders check the sizes they are given against the ones ``suite`` names
        for name in ("naive", "optimized"):
            object.__setattr__(self, name, _checking_sizes(self, name, getattr(self, name)))


@dataclass(frozen=True)
class _CheckingSizes:
    """``build`` refusing a sizes dict that lacks a size it reads (one of the ``suite`` names:
    a naive program reads fewer than its μGraph) or holds something other than a positive int
    under one of them (it raised a KeyError or a cryptic shape error inside). A plain object,
    so a workload's builders still pickle."""

    workload: str
    what: str
    names: tuple[str, ...]
    build: Callable[..., KernelGraph]

    def __call__(self, sizes: Sizes, *args, **kwargs) -> KernelGraph:
        where = f"{self.workload}.{self.what}"
        if not isinstance(sizes, dict):
            raise ShapeError(f"{where}: sizes must be a dict of {list(self.names)}, got "
                             f"{type(sizes).__name__}")
        bad = {k: sizes[k] for k in self.names if k in sizes and (
            not isinstance(sizes[k], int) or isinstance(sizes[k], bool) or sizes[k] < 1)}
        if bad:
            raise ShapeError(f"{where}: sizes must be positive ints, got {bad}")
        try:
            return self.build(sizes, *args, **kwargs)
        except KeyError as error:
            name = error.args[0] if error.args else None
            if name not in self.names or name in sizes:
                raise  # not a size the caller left out
            raise ShapeError(f"{where}: sizes lack {name!r} (a size of {list(self.names)})"
                             ) from None


def _checking_sizes(workload: Workload, what: str, build: Callable[..., KernelGraph]):
    return _CheckingSizes(workload.name, what, tuple(workload.suite), build)


# ---- RMSNorm + Linear: one kernel, rms accumulated beside the matmul (seed 003 §4.6.1) --------


def rmsnorm_linear_naive(s: Sizes, dtype: DType = float16) -> KernelGraph:
    g = new_kernel_graph()
    x = g.new_input((s["m"], s["k"]), dtype=dtype)
    w = g.new_input((s["k"], s["n"]), dtype=dtype)
    g.mark_output(g.matmul(g.rms_norm(x, s["k"]), w))
    return g


def rmsnorm_linear_fused(s: Sizes, dtype: DType = float16) -> KernelGraph:
    """O = (X @ W) / rms(X): the normalisation moves past the matmul (it scales rows)."""
    g = new_kernel_graph()
    x = g.new_input((s["m"], s["k"]), dtype=dtype)
    w = g.new_input((s["k"], s["n"]), dtype=dtype)
    tb = new_threadblock_graph((s["n"] // s["n_tile"], 1, 1), (128, 1, 1), s["k"] // s["k_tile"])
    tx = tb.new_input(x, (-1, -1, -1), forloop_dim=1)
    tw = tb.new_input(w, (1, -1, -1), forloop_dim=0)
    acc_xw = tb.forloop_accum(tb.matmul(tx, tw))
    rms_x = tb.forloop_accum(tx, "rms")
    tb.new_output(tb.div(acc_xw, rms_x), (1, -1, -1))
    (out,) = g.customized([x, w], tb)
    g.mark_output(out)
    return g


# ---- gated MLP: both matmuls and the gate in one kernel -------------------------------------


def gated_mlp_naive(s: Sizes, dtype: DType = float16) -> KernelGraph:
    g = new_kernel_graph()
    x = g.new_input((s["m"], s["k"]), dtype=dtype)
    w1 = g.new_input((s["k"], s["n"]), dtype=dtype)
    w3 = g.new_input((s["k"], s["n"]), dtype=dtype)
    g.mark_output(g.mul(g.silu(g.matmul(x, w1)), g.matmul(x, w3)))
    return g


def gated_mlp_fused(s: Sizes, dtype: DType = float16) -> KernelGraph:
    g = new_kernel_graph()
    x = g.new_input((s["m"], s["k"]), dtype=dtype)
    w1 = g.new_input((s["k"], s["n"]), dtype=dtype)
    w3 = g.new_input((s["k"], s["n"]), dtype=dtype)
    tb = new_threadblock_graph((s["n"] // s["n_tile"], 1, 1), (128, 1, 1), s["k"] // s["k_tile"])
    tx = tb.new_input(x, (-1, -1, -1), forloop_dim=1)
    tw1 = tb.new_input(w1, (1, -1, -1), forloop_dim=0)
    tw3 = tb.new_input(w3, (1, -1, -1), forloop_dim=0)
    a1 = tb.forloop_accum(tb.matmul(tx, tw1))
    a3 = tb.forloop_accum(tb.matmul(tx, tw3))
    tb.new_output(tb.mul(tb.silu(a1), a3), (1, -1, -1))
    (out,) = g.customized([x, w1, w3], tb)
    g.mark_output(out)
    return g


# ---- LoRA: X@W + (X@A)@B in one kernel through concatenation (paper Fig 9b) -----------------


def lora_naive(s: Sizes, dtype: DType = float16) -> KernelGraph:
    g = new_kernel_graph()
    x = g.new_input((s["m"], s["k"]), dtype=dtype)
    w = g.new_input((s["k"], s["n"]), dtype=dtype)
    a = g.new_input((s["k"], s["r"]), dtype=dtype)
    b = g.new_input((s["r"], s["n"]), dtype=dtype)
    g.mark_output(g.add(g.matmul(x, w), g.matmul(g.matmul(x, a), b)))
    return g


def lora_fused(s: Sizes, dtype: DType = float16) -> KernelGraph:
    """X@W + (X@A)@B = (X || X@A) @ (W ; B): one matmul over a concatenated inner dim.

    With ``k_tile == k`` (no for-loop) the concatenation happens on the tiles; with a for-loop
    X@W and X@A are accumulated and the post-loop tiles are concatenated:
    (X@W || X@A) @ (I ; B) is not expressible without an identity, so the looped form adds
    X@W to (X@A)@B after the loop instead.
    """
    g = new_kernel_graph()
    x = g.new_input((s["m"], s["k"]), dtype=dtype)
    w = g.new_input((s["k"], s["n"]), dtype=dtype)
    a = g.new_input((s["k"], s["r"]), dtype=dtype)
    b = g.new_input((s["r"], s["n"]), dtype=dtype)
    loops = s["k"] // s["k_tile"]
    tb = new_threadblock_graph((s["n"] // s["n_tile"], 1, 1), (128, 1, 1), loops)
    fdim_x, fdim_w = (1, 0) if loops > 1 else (-1, -1)
    tx = tb.new_input(x, (-1, -1, -1), forloop_dim=fdim_x)
    tw = tb.new_input(w, (1, -1, -1), forloop_dim=fdim_w)
    ta = tb.new_input(a, (-1, -1, -1), forloop_dim=fdim_w)
    tbb = tb.new_input(b, (1, -1, -1), forloop_dim=-1)
    if loops == 1:
        xa = tb.matmul(tx, ta)
        out = tb.matmul(tb.concat(tx, xa, 1), tb.concat(tw, tbb, 0))
    else:
        xw = tb.forloop_accum(tb.matmul(tx, tw))
        xa = tb.forloop_accum(tb.matmul(tx, ta))
        out = tb.add(xw, tb.matmul(xa, tbb))
    tb.new_output(out, (1, -1, -1))
    (o,) = g.customized([x, w, a, b], tb)
    g.mark_output(o)
    return g


# ---- adapter MLP: relu(X@W1)@W2 with partial sums over the long dim (paper Fig 10b) ----------


def adapter_mlp_naive(s: Sizes, dtype: DType = float16) -> KernelGraph:
    g = new_kernel_graph()
    x = g.new_input((s["m"], s["k"]), dtype=dtype)
    w1 = g.new_input((s["k"], s["r"]), dtype=dtype)
    w2 = g.new_input((s["r"], s["n"]), dtype=dtype)
    g.mark_output(g.matmul(g.relu(g.matmul(x, w1)), w2))
    return g


def adapter_mlp_partial_sums(s: Sizes, dtype: DType = float16) -> KernelGraph:
    """Kernel 1 splits k over ``parts`` blocks, each writing a partial X@W1; kernel 2 sums the
    partials in its for-loop, applies relu and multiplies by its columns of W2."""
    g = new_kernel_graph()
    m, k, r, n, parts = s["m"], s["k"], s["r"], s["n"], s["parts"]
    x = g.new_input((m, k), dtype=dtype)
    w1 = g.new_input((k, r), dtype=dtype)
    w2 = g.new_input((r, n), dtype=dtype)
    tb1 = new_threadblock_graph((parts, 1, 1), (128, 1, 1), k // parts // s["k_tile"])
    tx = tb1.new_input(x, (1, -1, -1), forloop_dim=1)
    tw1 = tb1.new_input(w1, (0, -1, -1), forloop_dim=0)
    tb1.new_output(tb1.forloop_accum(tb1.matmul(tx, tw1)), (1, -1, -1))
    (partials,) = g.customized([x, w1], tb1)  # [m, r * parts]
    tb2 = new_threadblock_graph((n // s["n_tile"], 1, 1), (128, 1, 1), parts)
    th = tb2.new_input(partials, (-1, -1, -1), forloop_dim=1)
    tw2 = tb2.new_input(w2, (1, -1, -1), forloop_dim=-1)
    hidden = tb2.relu(tb2.forloop_accum(th))
    tb2.new_output(tb2.matmul(hidden, tw2), (1, -1, -1))
    (out,) = g.customized([partials, w2], tb2)
    g.mark_output(out)
    return g


# ---- attention: softmax(Q @ K) @ V ------------------------------------------------------------


def _attention_inputs(g: KernelGraph, s: Sizes, dtype: DType):
    """Q, K (already transposed: [.., d, n]) and V. With one KV head per query head the
    tensors are [h, s, d], [h, d, n], [h, n, d]; with grouped heads (h_kv < h) they are
    [h_kv, group, s, d], [h_kv, 1, d, n], [h_kv, 1, n, d] and the matmuls broadcast K and V
    over the group dim, as PyTorch does."""
    heads, kv_heads = s["h"], s["h_kv"]
    if heads == kv_heads:
        return (
            g.new_input((heads, s["s"], s["d"]), dtype=dtype),
            g.new_input((heads, s["d"], s["n"]), dtype=dtype),
            g.new_input((heads, s["n"], s["d"]), dtype=dtype),
        )
    group = heads // kv_heads
    return (
        g.new_input((kv_heads, group, s["s"], s["d"]), dtype=dtype),
        g.new_input((kv_heads, 1, s["d"], s["n"]), dtype=dtype),
        g.new_input((kv_heads, 1, s["n"], s["d"]), dtype=dtype),
    )


def attention_naive(s: Sizes, dtype: DType = float16) -> KernelGraph:
    """softmax(Q @ K, last dim) @ V, softmax as exp / sum / div."""
    g = new_kernel_graph()
    q, k, v = _attention_inputs(g, s, dtype)
    g.mark_output(g.matmul(g.softmax(g.matmul(q, k), dim=-1), v))
    return g


def _combine_partials(g: KernelGraph, acc, total, s: Sizes, head_tile: int):
    """Second kernel of split-KV attention: sum the partial numerators and denominators over
    the ``parts`` KV chunks (its for-loop, along their last dim) and divide."""
    last = acc.num_dims - 1
    tb = new_threadblock_graph((acc.dims[0] // head_tile, 1, 1), (128, 1, 1), s["parts"])
    ta = tb.new_input(acc, (0, -1, -1), forloop_dim=last)
    tt = tb.new_input(total, (0, -1, -1), forloop_dim=last)
    tb.new_output(tb.div(tb.forloop_accum(ta), tb.forloop_accum(tt)), (0, -1, -1))
    (out,) = g.customized([acc, total], tb)
    return out


def attention_flashdecoding(s: Sizes, dtype: DType = float16) -> KernelGraph:
    """Paper Fig 4b: kernel 1 splits the KV sequence over ``parts`` blocks (grid y) and the
    query rows over ``s_parts`` blocks (grid z), loops over its KV chunk, and keeps partial
    sums of exp(QK)V and exp(QK); kernel 2 combines them."""
    if s["h_kv"] != s["h"]:
        raise ValueError("attention_flashdecoding expects one KV head per query head")
    g = new_kernel_graph()
    q, k, v = _attention_inputs(g, s, dtype)
    parts, rows = s["parts"], s.get("s_parts", 1)
    loops = s["n"] // parts // s["n_tile"]
    tb = new_threadblock_graph((s["h"] // s["h_tile"], parts, rows), (128, 1, 1), loops)
    tq = tb.new_input(q, (0, -1, 1), forloop_dim=-1)
    tk = tb.new_input(k, (0, 2, -1), forloop_dim=2)
    tv = tb.new_input(v, (0, 1, -1), forloop_dim=1)
    e = tb.exp(tb.matmul(tq, tk))
    acc = tb.forloop_accum(tb.matmul(e, tv))
    total = tb.forloop_accum(e, "sum")
    tb.new_output(acc, (0, 2, 1))  # partial numerators side by side along d: [h, s, d*parts]
    tb.new_output(total, (0, 2, 1))  # partial denominators: [h, s, parts]
    acc_all, total_all = g.customized([q, k, v], tb)
    g.mark_output(_combine_partials(g, acc_all, total_all, s, s["h_tile2"]))
    return g


def attention_flash(s: Sizes, dtype: DType = float16) -> KernelGraph:
    """One kernel, FlashAttention-shaped (what the search finds at small sizes): a block takes
    ``h_tile`` heads, a ``s_parts``-th of the query rows and a ``d_parts``-th of V's head dim,
    loops over the whole KV sequence in chunks of ``n_tile`` keeping sums of exp(QK)V and
    exp(QK), and divides after the loop. The code generator runs that exp with the running
    row maximum subtracted (mugraph.codegen.stable_exp), so it does not overflow."""
    if s["h_kv"] != s["h"]:
        raise ValueError("attention_flash expects one KV head per query head")
    g = new_kernel_graph()
    q, k, v = _attention_inputs(g, s, dtype)
    grid = (s["h"] // s["h_tile"], s.get("s_parts", 1), s.get("d_parts", 1))
    tb = new_threadblock_graph(grid, (128, 1, 1), s["n"] // s["n_tile"])
    tq = tb.new_input(q, (0, 1, -1), forloop_dim=-1)
    tk = tb.new_input(k, (0, -1, -1), forloop_dim=2)
    tv = tb.new_input(v, (0, -1, 2), forloop_dim=1)
    e = tb.exp(tb.matmul(tq, tk))
    out = tb.div(tb.forloop_accum(tb.matmul(e, tv)), tb.forloop_accum(e, "sum"))
    tb.new_output(out, (0, 1, 2))
    (o,) = g.customized([q, k, v], tb)
    g.mark_output(o)
    return g


def attention_mirage_gqa(s: Sizes, dtype: DType = float16) -> KernelGraph:
    """Paper Fig 4c: a block takes one KV head with its ``group`` query heads and reshapes the
    queries [1, group, s, d] to [1, group*s, d], so QK is a matrix-matrix product (tensor
    cores); partial sums over ``parts`` KV chunks are combined by a second kernel."""
    g = new_kernel_graph()
    kv_heads, seq, d = s["h_kv"], s["s"], s["d"]
    group = s["h"] // kv_heads
    if group == 1:
        raise ValueError("attention_mirage_gqa expects grouped heads (h_kv < h)")
    q, k, v = _attention_inputs(g, s, dtype)
    parts = s["parts"]
    loops = s["n"] // parts // s["n_tile"]
    n_tile = s["n_tile"]
    tb = new_threadblock_graph((kv_heads, parts, 1), (128, 1, 1), loops)
    tq = tb.reshape(tb.new_input(q, (0, -1, -1), forloop_dim=-1), (1, group * seq, d))
    tk = tb.reshape(tb.new_input(k, (0, 3, -1), forloop_dim=3), (1, d, n_tile))
    tv = tb.reshape(tb.new_input(v, (0, 2, -1), forloop_dim=2), (1, n_tile, d))
    e = tb.exp(tb.matmul(tq, tk))
    acc = tb.reshape(tb.forloop_accum(tb.matmul(e, tv)), (1, group, seq, d))
    total = tb.reshape(tb.forloop_accum(e, "sum"), (1, group, seq, 1))
    tb.new_output(acc, (0, 3, -1))  # [h_kv, group, s, d*parts]
    tb.new_output(total, (0, 3, -1))  # [h_kv, group, s, parts]
    acc_all, total_all = g.customized([q, k, v], tb)
    g.mark_output(_combine_partials(g, acc_all, total_all, s, s["h_tile2"]))
    return g


WORKLOADS: dict[str, Workload] = {
    w.name: w
    for w in [
        Workload(
            "rmsnorm_linear",
            "O = rms_norm(X) @ W in one custom kernel",
            rmsnorm_linear_naive,
            rmsnorm_linear_fused,
            small={"m": 4, "k": 256, "n": 96, "k_tile": 64, "n_tile": 16},
            suite={"m": 2, "k": 4096, "n": 6144, "k_tile": 256, "n_tile": 64},
        ),
        Workload(
            "gated_mlp",
            "O = silu(X @ W1) * (X @ W3) in one custom kernel",
            gated_mlp_naive,
            gated_mlp_fused,
            small={"m": 8, "k": 128, "n": 64, "k_tile": 32, "n_tile": 16},
            suite={"m": 8, "k": 4096, "n": 4096, "k_tile": 128, "n_tile": 64},
        ),
        Workload(
            "lora",
            "O = X @ W + (X @ A) @ B in one custom kernel through concatenation",
            lora_naive,
            lora_fused,
            small={"m": 16, "k": 64, "n": 128, "r": 16, "k_tile": 64, "n_tile": 32},
            suite={"m": 16, "k": 256, "n": 4096, "r": 16, "k_tile": 256, "n_tile": 64},
            extra={"looped": {"m": 4, "k": 4096, "n": 4096, "r": 16, "k_tile": 256, "n_tile": 32}},
        ),
        Workload(
            "adapter_mlp",
            "O = relu(X @ W1) @ W2 with partial sums of X @ W1 over blocks",
            adapter_mlp_naive,
            adapter_mlp_partial_sums,
            small={"m": 8, "k": 256, "r": 16, "n": 64, "parts": 4, "k_tile": 32, "n_tile": 16},
            suite={"m": 8, "k": 4096, "r": 16, "n": 4096, "parts": 32, "k_tile": 128, "n_tile": 64},
        ),
        Workload(
            "attention_flashdecoding",
            "softmax(Q @ K) @ V split over the KV sequence with partial sums (Fig 4b)",
            attention_naive,
            attention_flashdecoding,
            small={
                "h": 2,
                "h_kv": 2,
                "s": 8,
                "d": 16,
                "n": 128,
                "parts": 4,
                "n_tile": 16,
                "h_tile": 1,
                "h_tile2": 1,
                "s_parts": 2,
            },
            suite={
                "h": 2,
                "h_kv": 2,
                "s": 256,
                "d": 64,
                "n": 4096,
                "parts": 8,
                "n_tile": 64,
                "h_tile": 1,
                "h_tile2": 1,
                "s_parts": 8,
            },
        ),
        Workload(
            "attention_flash",
            "softmax(Q @ K) @ V in one kernel over the whole KV sequence (FlashAttention)",
            attention_naive,
            attention_flash,
            small={"h": 2, "h_kv": 2, "s": 32, "d": 16, "n": 128, "n_tile": 32, "h_tile": 1,
                   "s_parts": 2, "d_parts": 2},
            suite={"h": 2, "h_kv": 2, "s": 256, "d": 64, "n": 4096, "n_tile": 64, "h_tile": 1,
                   "s_parts": 8, "d_parts": 4},
        ),
        Workload(
            "attention_mirage_gqa",
            "grouped-query attention with the in-block reshape of Fig 4c",
            attention_naive,
            attention_mirage_gqa,
            small={
                "h": 8,
                "h_kv": 2,
                "s": 1,
                "d": 16,
                "n": 128,
                "parts": 4,
                "n_tile": 16,
                "h_tile2": 1,
            },
            suite={
                "h": 16,
                "h_kv": 2,
                "s": 1,
                "d": 128,
                "n": 4096,
                "parts": 32,
                "n_tile": 64,
                "h_tile2": 1,
            },
        ),
    ]
}
