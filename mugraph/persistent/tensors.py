"""Tensors of a persistent kernel and where their bytes live.

A persistent kernel's μGraph is an ordinary kernel graph; what it adds is a *binding* for each
device tensor, saying which memory a task reads or writes:

- :class:`Attached`: a PyTorch tensor the user attached (a weight, a constant table, a cache),
  possibly seen through other strides (the key cache read transposed);
- :class:`Row`: row ``meta[slot]`` of an attached table, chosen at run time by a scalar of the
  kernel's meta buffer (the embedding row of the current token, the RoPE and mask rows of the
  current position, the cache row the current token's key is appended to);
- :class:`Scratch`: an intermediate the kernel allocates (one buffer per tensor, written once
  per step: the task graph has no write-after-read hazards inside a step).

The meta buffer is a small int32 tensor on the device: position, step, current token, the
count of programs that finished the step, an error flag.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any

from mugraph.dtypes import DType
from mugraph.ir.tensor import DTensor


class MetaSlot(enum.IntEnum):
    """Scalars of the meta buffer (int32), read by every program at the start of a step."""

    POS = 0  # position of the current token (where its key and value go in the caches)
    STEP = 1  # steps run so far (events count up by one target per step)
    TOKEN = 2  # the current token (input of the embedding; the argmax writes the next one)
    DONE = 3  # programs that finished this step (the last one advances POS and STEP)
    ERROR = 4  # 0, or 1 + the task that gave up waiting (persistent mode's spin limit)
    CLAIM_BASE = 5  # where the block counters begin in the event array (with claims)
    CLAIMS = 6  # how many block counters there are (two slots each: even and odd steps)


META_SIZE = 8
DYNAMIC_INDICES = {"pos": MetaSlot.POS, "token": MetaSlot.TOKEN}


@dataclass(frozen=True)
class Attached:
    """A user's tensor, seen with the DTensor's dims and strides from ``offset`` elements."""

    tensor: Any  # torch.Tensor
    offset: int = 0


@dataclass(frozen=True)
class Row:
    """Row ``meta[slot]`` of ``table`` (a 2-D tensor): base + meta[slot] * row_stride."""

    table: Any  # torch.Tensor
    slot: MetaSlot

    @property
    def row_stride(self) -> int:
        return int(self.table.stride(0))


@dataclass(frozen=True)
class Scratch:
    """An intermediate allocated by the runtime."""


Binding = Attached | Row | Scratch


@dataclass
class PTensor:
    """A tensor handle of a :class:`~mugraph.persistent.kernel.PersistentKernel`.

    ``dtensor`` is None for a placeholder made by ``new_tensor`` until a layer writes it.
    """

    name: str
    dims: tuple[int, ...]
    dtype: DType
    binding: Binding
    dtensor: DTensor | None = None
    writer: str | None = None  # the layer that writes it
    pending: Any = None  # a PendingAttention or PendingSum (see PersistentKernel._read)

    @property
    def shape(self) -> tuple[int, ...]:
        return self.dims

    def __repr__(self) -> str:
        dims = ", ".join(map(str, self.dims))
        return f"PTensor({self.name!r}, [{dims}] {self.dtype.value})"
