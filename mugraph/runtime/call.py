"""Calling a kernel graph on tensors: checks the inputs, then runs the reference semantics on
the CPU (or the compiled Triton program on CUDA tensors, once compiled)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from mugraph.errors import GraphInputError
from mugraph.ir.tensor import TensorType


def _describe(x: Any) -> str:
    return f"{type(x).__name__} {tuple(getattr(x, 'shape', ()))} {getattr(x, 'dtype', '?')}"


def check_inputs(graph, inputs: Sequence[Any]) -> None:
    """Number, shapes and dtypes of ``inputs`` must match the graph's inputs."""
    graph.check()
    expected: tuple[TensorType, ...] = graph.input_types
    if inputs is None or len(inputs) != len(expected):
        got = "no" if inputs is None else len(inputs)
        raise GraphInputError(f"graph takes {len(expected)} inputs, got {got}")
    for i, (x, want) in enumerate(zip(inputs, expected, strict=True)):
        shape = tuple(getattr(x, "shape", ()))
        if shape != want.dims:
            raise GraphInputError(
                f"input {i}: expected shape {list(want.dims)}, got {_describe(x)}"
            )
        dtype = str(getattr(x, "dtype", "")).removeprefix("torch.")
        if dtype != want.dtype.value:
            raise GraphInputError(
                f"input {i}: expected dtype {want.dtype.value}, got {_describe(x)}"
            )
    devices = {str(getattr(x, "device", "cpu")) for x in inputs}
    if len(devices) > 1:
        raise GraphInputError(f"inputs are on different devices: {sorted(devices)}")


def _is_torch(x: Any) -> bool:
    return type(x).__module__.startswith("torch")


def call_graph(graph, inputs: Sequence[Any] | None = None, **kwargs: Any) -> list[Any]:
    """``graph(inputs=[...])``: the graph's outputs, as torch tensors for torch inputs."""
    check_inputs(graph, inputs)
    first = inputs[0] if inputs else None
    if getattr(getattr(first, "device", None), "type", "cpu") == "cuda":
        from mugraph.runtime.compiled import compile_graph

        return compile_graph(graph)(inputs=inputs, **kwargs)
    from mugraph.semantics.reference import evaluate

    is_torch = _is_torch(first)
    arrays = [x.detach().double().numpy() if _is_torch(x) else np.asarray(x) for x in inputs]
    outs = evaluate(graph, arrays)
    if not is_torch:
        return [
            o.astype(t.dtype.numpy_dtype) for o, t in zip(outs, graph.output_types, strict=True)
        ]
    import torch

    # evaluate may hand back read-only (broadcast) views: copy those, and only those
    return [
        torch.from_numpy(np.require(o, requirements="W")).to(getattr(torch, t.dtype.torch_name))
        for o, t in zip(outs, graph.output_types, strict=True)
    ]
