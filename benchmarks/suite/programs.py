"""The suite's programs, one family per kind of workload: the naive mugraph program (a
KernelGraph built at given sizes), the same computation in PyTorch (what eager and
torch.compile run, and the correctness reference) and the analytic byte and flop counts.

Sizes are plain dicts of ints. Attention (``h`` heads, ``s`` query rows, head dim ``d``,
``n`` KV tokens) is three-dimensional: Q [h, s, d], K used as [h, d, n], V [h, n, d]; grouped
query heads are folded into the rows (``s`` = group x tokens), as the Mirage shapes do. With
``k_nd`` = 1 K is stored as [h, n, d] (a KV cache's layout) and the program reads it through a
transposed view (strides); with 0 it is stored transposed, [h, d, n] contiguous, as the Mirage
benchmark scripts give it.

The PyTorch functions take the program's inputs, in order and in the same layouts.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from mugraph.dtypes import DType, float16
from mugraph.ir.builder import KernelGraph, new_kernel_graph
from mugraph.library import adapter_mlp_naive, gated_mlp_naive, lora_naive, rmsnorm_linear_naive

Sizes = dict[str, int]
ITEMSIZE = 2  # float16


# ---- naive mugraph programs -----------------------------------------------------------------


def _k_strides(s: Sizes) -> tuple[int, int, int] | None:
    """Strides of K [h, d, n]: a transposed view of [h, n, d] storage when ``k_nd``."""
    return (s["n"] * s["d"], 1, s["d"]) if s.get("k_nd") else None


def _attention_inputs(g: KernelGraph, s: Sizes, dtype: DType):
    q = g.new_input((s["h"], s["s"], s["d"]), dtype=dtype)
    k = g.new_input((s["h"], s["d"], s["n"]), strides=_k_strides(s), dtype=dtype)
    v = g.new_input((s["h"], s["n"], s["d"]), dtype=dtype)
    return q, k, v


def attention_program(s: Sizes, dtype: DType = float16) -> KernelGraph:
    """O = softmax(Q @ K, last dim) @ V; softmax as exp, a sum and a division."""
    g = new_kernel_graph()
    q, k, v = _attention_inputs(g, s, dtype)
    g.mark_output(g.matmul(g.softmax(g.matmul(q, k), dim=-1), v))
    return g


def qknorm_terms(g: KernelGraph, q, k, d: int):
    """Qn = Q / rms(Q, last dim) (the kernel rms_norm, over trailing dims) and
    Kn = K / sqrt(mean(K^2, dim 1)) written out: square, sum over dim 1, x 1/d, sqrt, div."""
    qn = g.rms_norm(q, d)
    mean_sq = g.mul_scalar(g.reduction(g.square(k), 1), 1.0 / d)
    kn = g.div(k, g.sqrt(mean_sq))
    return qn, kn


def qknorm_attention_program(s: Sizes, dtype: DType = float16) -> KernelGraph:
    """Qn, Kn as :func:`qknorm_terms`, then softmax(Qn @ Kn) @ V."""
    g = new_kernel_graph()
    q, k, v = _attention_inputs(g, s, dtype)
    qn, kn = qknorm_terms(g, q, k, s["d"])
    g.mark_output(g.matmul(g.softmax(g.matmul(qn, kn), dim=-1), v))
    return g


# The matmul-chain programs are the library's own naive programs (same size keys).
rmsnorm_linear_program = rmsnorm_linear_naive
gated_mlp_program = gated_mlp_naive
lora_program = lora_naive
mlp_adapter_program = adapter_mlp_naive


# ---- the same in PyTorch ---------------------------------------------------------------------


def _rms(x: torch.Tensor, dim: int) -> torch.Tensor:
    """sqrt(mean(x^2)) over ``dim`` (kept), no epsilon, as mugraph's rms_norm."""
    return torch.sqrt(torch.mean(x * x, dim=dim, keepdim=True))


def attention_torch(q, k, v):
    """softmax(Q @ K) @ V with K as [h, d, n] (a transposed view where the row stores [n, d])."""
    return torch.softmax(q @ k, dim=-1) @ v


def qknorm_attention_torch(q, k, v):
    qn = F.rms_norm(q, (q.shape[-1],), eps=0.0)
    kn = k / _rms(k, 1)
    return torch.softmax(qn @ kn, dim=-1) @ v


def rmsnorm_linear_torch(x, w):
    return F.rms_norm(x, (x.shape[-1],), eps=0.0) @ w


def gated_mlp_torch(x, w1, w3):
    return F.silu(x @ w1) * (x @ w3)


def lora_torch(x, w, a, b):
    return x @ w + (x @ a) @ b


def mlp_adapter_torch(x, w1, w2):
    return torch.relu(x @ w1) @ w2


# ---- analytic counts (each input read once, each output written once) -----------------------


def attention_counts(s: Sizes) -> tuple[int, int]:
    h, q, d, n = s["h"], s["s"], s["d"], s["n"]
    elements = h * q * d + h * d * n + h * n * d + h * q * d
    return elements * ITEMSIZE, 4 * h * q * n * d


def rmsnorm_linear_counts(s: Sizes) -> tuple[int, int]:
    m, k, n = s["m"], s["k"], s["n"]
    return (m * k + k * n + m * n) * ITEMSIZE, 2 * m * k * n


def gated_mlp_counts(s: Sizes) -> tuple[int, int]:
    m, k, n = s["m"], s["k"], s["n"]
    return (m * k + 2 * k * n + m * n) * ITEMSIZE, 4 * m * k * n


def lora_counts(s: Sizes) -> tuple[int, int]:
    m, k, n, r = s["m"], s["k"], s["n"], s["r"]
    elements = m * k + k * n + k * r + r * n + m * n
    return elements * ITEMSIZE, 2 * m * k * n + 2 * m * k * r + 2 * m * r * n


def mlp_adapter_counts(s: Sizes) -> tuple[int, int]:
    m, k, r, n = s["m"], s["k"], s["r"], s["n"]
    return (m * k + k * r + r * n + m * n) * ITEMSIZE, 2 * m * k * r + 2 * m * r * n


# ---- families ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Family:
    """One kind of workload: its program, PyTorch function and counts.

    library: the :data:`mugraph.library.WORKLOADS` entry whose hand-written μGraph computes
    this program (None: none does); preset: the search config preset to search it with.
    """

    name: str
    program: Callable[..., KernelGraph]
    torch_fn: Callable[..., torch.Tensor]
    counts: Callable[[Sizes], tuple[int, int]]
    library: str | None
    preset: str | None = None
    attention: bool = False


FAMILIES: dict[str, Family] = {
    f.name: f
    for f in [
        Family("attention", attention_program, attention_torch, attention_counts,
               "attention_flashdecoding", "attention", attention=True),
        Family("qknorm_attention", qknorm_attention_program, qknorm_attention_torch,
               attention_counts, "attention_flashdecoding", "attention", attention=True),
        Family("rmsnorm_linear", rmsnorm_linear_program, rmsnorm_linear_torch,
               rmsnorm_linear_counts, "rmsnorm_linear"),
        Family("gated_mlp", gated_mlp_program, gated_mlp_torch, gated_mlp_counts, "gated_mlp"),
        Family("lora", lora_program, lora_torch, lora_counts, "lora", "lora"),
        Family("mlp_adapter", mlp_adapter_program, mlp_adapter_torch, mlp_adapter_counts,
               "adapter_mlp", "mlp"),
    ]
}
