"""The error hierarchy, and the limits just inside what the builder accepts.

What mugraph must reject (programs, maps, JSON documents, command lines), each with its error
class and message, is the corpus in tests/corpus/, walked by tests/test_corpus.py.
"""

from __future__ import annotations

import torch

import mugraph
from mugraph import (
    DTypeError,
    GraphInputError,
    GraphStructureError,
    MapError,
    MugraphError,
    ShapeError,
    SharedMemoryError,
    UnsupportedError,
)
from mugraph.gpu import DEFAULT_GPU, GPUSpec

F16, F32 = mugraph.float16, mugraph.float32
NONE = (-1, -1, -1)


def test_error_classes_derive_from_mugraph_error():
    for cls in (DTypeError, GraphInputError, GraphStructureError, MapError, ShapeError,
                SharedMemoryError, UnsupportedError, mugraph.SerializationError,
                mugraph.NotVerifiableError, mugraph.CodegenMismatchError):
        assert issubclass(cls, MugraphError)
    assert issubclass(MugraphError, Exception)


def test_default_gpu_is_h100():
    assert DEFAULT_GPU is mugraph.H100
    assert mugraph.H100.shared_memory_per_block == 227 * 1024
    assert mugraph.H100.max_threads_per_block == 1024
    assert mugraph.new_threadblock_graph((1,)).gpu is mugraph.H100


def test_a_block_graph_may_fill_the_shared_memory_exactly():
    g = mugraph.new_kernel_graph()
    a = g.new_input((227, 512))  # float16: exactly the H100's budget in one tile
    tb = mugraph.new_threadblock_graph((1,))
    tb.new_input(a, NONE, -1)
    assert tb.shared_memory_bytes() == mugraph.H100.shared_memory_per_block
    small = GPUSpec(name="tiny", shared_memory_per_block=1024, device_memory=1 << 30,
                    multiprocessors=1, max_threads_per_block=256)
    b = g.new_input((16, 64))
    tb = mugraph.new_threadblock_graph((2,), (256, 1, 1), gpu=small)
    tb.new_input(b, (0, -1, -1), -1)  # 8 * 64 * 2 = 1024 bytes
    assert tb.shared_memory_bytes() == 1024


def test_supported_dtypes_by_name():
    g = mugraph.new_kernel_graph()
    for name, want in [("float16", F16), (torch.bfloat16, mugraph.bfloat16), ("float32", F32)]:
        assert g.new_input((2, 2), dtype=name).dtype is want


def test_good_strides():
    g = mugraph.new_kernel_graph()
    assert g.new_input((4, 8), strides=(1, 4)).strides == (1, 4)  # column-major
    assert g.new_input((4, 8), strides=(16, 1)).strides == (16, 1)  # padded rows
    assert g.new_input((4, 1), strides=(1, 1)).strides == (1, 1)  # size-1 dims are free
