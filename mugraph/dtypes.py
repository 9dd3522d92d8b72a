"""Element types of mugraph tensors."""

from __future__ import annotations

import enum

import numpy as np

from mugraph.errors import DTypeError


class DType(enum.Enum):
    """A floating-point element type; the value is its canonical name."""

    float16 = "float16"
    bfloat16 = "bfloat16"
    float32 = "float32"

    @property
    def itemsize(self) -> int:
        return _ITEMSIZE[self]

    @property
    def torch_name(self) -> str:
        return self.value

    @property
    def numpy_dtype(self) -> np.dtype:
        """The NumPy type used to hold values of this dtype on the CPU (bfloat16 → float32)."""
        return np.dtype(np.float32) if self is DType.bfloat16 else np.dtype(self.value)

    def __repr__(self) -> str:
        return f"mugraph.{self.value}"


_ITEMSIZE = {DType.float16: 2, DType.bfloat16: 2, DType.float32: 4}

float16 = DType.float16
bfloat16 = DType.bfloat16
float32 = DType.float32


def as_dtype(value: object) -> DType:
    """Accept a DType, its name, or a torch / numpy dtype; raise DTypeError otherwise."""
    if isinstance(value, DType):
        return value
    name = str(value).removeprefix("torch.").removeprefix("mugraph.")
    try:
        return DType(name)
    except ValueError:
        supported = ", ".join(d.value for d in DType)
        raise DTypeError(f"unsupported dtype {value!r}: mugraph supports {supported}") from None
