"""Inputs, errors and counts shared by the runner, the search script and the tests."""

from __future__ import annotations

import math

import torch

from mugraph.ir.ops import OpKind

INPUT_SCALE = 0.5  # inputs are uniform in [-0.5, 0.5]


def make_inputs(graph, device, seed: int, scale: float = INPUT_SCALE, dtype=None) -> list:
    """Fresh uniform(-scale, scale) tensors for ``graph``'s inputs, with its declared dims and
    strides (a transposed view stays one), in its dtypes or in ``dtype``."""
    device = torch.device(device)
    gen = torch.Generator(device=device).manual_seed(seed)
    out = []
    for t in graph.input_types:
        want = dtype or getattr(torch, t.dtype.torch_name)
        buf = torch.empty_strided(t.dims, t.strides, dtype=want, device=device)
        if want in (torch.float16, torch.bfloat16) and device.type == "cpu":
            values = torch.empty(t.dims, dtype=torch.float32).uniform_(-scale, scale, generator=gen)
            buf.copy_(values)
        else:
            buf.uniform_(-scale, scale, generator=gen)
        out.append(buf)
    return out


def rel_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    """||out - ref|| / ||ref|| in float64 (inf when out has non-finite values)."""
    out, ref = out.detach().double(), ref.detach().double()
    if out.shape != ref.shape:
        raise ValueError(f"output shape {tuple(out.shape)} differs from {tuple(ref.shape)}")
    if not torch.isfinite(out).all():
        return math.inf
    return float((out - ref).norm() / ref.norm().clamp_min(1e-30))


def graph_counts(graph) -> tuple[int, int]:
    """(bytes of every input read once and every output written once, matmul flops) of a
    kernel graph, from its types: what the floor counts."""
    moved = sum(t.num_bytes for t in graph.input_types)
    moved += sum(t.num_bytes for t in graph.output_types)
    flops = 0
    for op in graph.ops:
        if op.kind is OpKind.MATMUL:
            a = graph.tensor_type(op.inputs[0])
            flops += 2 * math.prod(op.outputs[0].dims) * a.dims[-1]
    return moved, flops


def floor_seconds(moved: int, flops: int, bandwidth: float, matmul_rate: float):
    """max(bytes / bandwidth, flops / matmul rate) and which of the two bounds it."""
    t_mem, t_math = moved / bandwidth, flops / matmul_rate
    return (t_mem, "bytes") if t_mem >= t_math else (t_math, "flops")
