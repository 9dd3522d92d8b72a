"""A numeric check of each capture: the kernel graph against the fx nodes it replaces.

Both run in float64 on the CPU on the same random inputs: the partition's original PyTorch
nodes, and the kernel graph's reference semantics. A lowering rule that is not exact (a
missing epsilon, a wrong broadcast, an approximated function) shows up as a difference far
above float64 rounding, and the partition stays on PyTorch.
"""

from __future__ import annotations

import numpy as np
import torch

from mugraph.integration.capture import CapturedProgram, ExternalInput, apply_adapters, meta_value
from mugraph.integration.lowering import op_name

RTOL = 1e-6
RTOL_WITH_CASTS = 1e-4  # ``.float()`` and friends round float64 check values to float32


def _random_raw(captured: CapturedProgram, generator: torch.Generator) -> list:
    raw = []
    for node in captured.raw_inputs:
        value = meta_value(node)
        if isinstance(value, torch.Tensor) and value.dtype is torch.bool:
            raw.append(torch.rand(tuple(value.shape), generator=generator) < 0.7)
        elif isinstance(value, torch.Tensor):
            raw.append(torch.randn(tuple(value.shape), generator=generator, dtype=torch.float64))
        else:
            raw.append(value)
    return raw


def _program_inputs(captured: CapturedProgram, raw: list) -> list[np.ndarray]:
    arrays = []
    for spec in captured.input_specs:
        if isinstance(spec, ExternalInput):
            view = apply_adapters(raw[spec.source], spec.adapters, torch.float64)
            arrays.append(view.numpy())
        else:
            arrays.append(spec.tensor("cpu", torch.float64).numpy())
    return arrays


def _difference(got: np.ndarray, want: np.ndarray) -> float:
    """Largest difference relative to the largest magnitude (NaNs must agree)."""
    if got.shape != want.shape or not np.array_equal(np.isnan(got), np.isnan(want)):
        return float("inf")
    finite = np.isfinite(want)
    if not np.array_equal(finite, np.isfinite(got)):
        return float("inf")
    if not finite.any():
        return 0.0
    scale = max(float(np.max(np.abs(want[finite]))), 1e-300)
    return float(np.max(np.abs(got[finite] - want[finite]))) / scale


def check_capture(captured: CapturedProgram, fallback, seed: int = 0) -> str | None:
    """None when the kernel graph computes what ``fallback`` computes, else what differs."""
    from mugraph.semantics.reference import evaluate

    generator = torch.Generator().manual_seed(seed)
    raw = _random_raw(captured, generator)
    with torch.no_grad():
        want = fallback(*raw)
    got = evaluate(captured.graph, _program_inputs(captured, raw))
    casts = any(op_name(n) == "cast" for n in captured.nodes)
    rtol = RTOL_WITH_CASTS if casts else RTOL
    for k, node in enumerate(captured.outputs):
        value = got[captured.output_index[k]]
        if captured.output_shapes and captured.output_shapes[k] is not None:
            value = value.reshape(captured.output_shapes[k])
        diff = _difference(value, want[k].double().numpy())
        if not diff <= rtol:
            return f"{node.name}: the captured program differs from PyTorch by {diff:.2e}"
    return None
