"""Tensor types and the handles the builders return."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from mugraph.dtypes import DType

if TYPE_CHECKING:
    from mugraph.ir.builder import GraphBuilder


def contiguous_strides(dims: tuple[int, ...]) -> tuple[int, ...]:
    """Row-major strides (in elements) of a dense tensor of shape ``dims``."""
    strides = []
    step = 1
    for d in reversed(dims):
        strides.append(step)
        step *= d
    return tuple(reversed(strides))


@dataclass(frozen=True)
class TensorType:
    """Shape, element type and (for device tensors) layout of a tensor.

    ``strides`` is None for shared-memory tensors, whose layout the optimizer chooses; it
    never changes what a graph computes.
    """

    dims: tuple[int, ...]
    dtype: DType
    strides: tuple[int, ...] | None = None

    @property
    def num_elements(self) -> int:
        return math.prod(self.dims)

    @property
    def num_bytes(self) -> int:
        return self.num_elements * self.dtype.itemsize

    def __str__(self) -> str:
        text = f"[{', '.join(map(str, self.dims))}] {self.dtype.value}"
        if self.strides is not None and self.strides != contiguous_strides(self.dims):
            text += f" strides=({', '.join(map(str, self.strides))})"
        return text


@dataclass(frozen=True)
class TensorRef:
    """Where a tensor comes from inside one graph: output ``index`` of operator ``op``."""

    op: int
    index: int = 0

    def __str__(self) -> str:
        return f"%{self.op}" if self.index == 0 else f"%{self.op}.{self.index}"


@dataclass(frozen=True)
class Tensor:
    """A tensor handle returned by a builder: a position in a graph plus its type.

    Handles compare by position and type; ``graph`` (the builder that made it) is kept only
    to reject tensors passed to the wrong graph.
    """

    ref: TensorRef
    type: TensorType
    graph: GraphBuilder = field(compare=False, repr=False)

    @property
    def dims(self) -> tuple[int, ...]:
        return self.type.dims

    @property
    def shape(self) -> tuple[int, ...]:
        return self.type.dims

    @property
    def num_dims(self) -> int:
        return len(self.type.dims)

    @property
    def dtype(self) -> DType:
        return self.type.dtype

    @property
    def strides(self) -> tuple[int, ...] | None:
        return self.type.strides

    def dim(self, i: int) -> int:
        return self.type.dims[i]

    def __str__(self) -> str:
        return f"{self.ref}: {self.type}"


class DTensor(Tensor):
    """A device-memory tensor of a kernel graph."""

    __slots__ = ()


class STensor(Tensor):
    """A shared-memory tensor of a thread-block graph (one block's tile)."""

    __slots__ = ()
