"""The error hierarchy, and the limits just inside what the builder accepts.

What mugraph must reject (programs, maps, JSON documents, command lines), each with its error
class and message, is the corpus in tests/corpus/, walked by tests/test_corpus.py.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

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
                mugraph.NotVerifiableError, mugraph.CodegenMismatchError,
                mugraph.MissingDependencyError):
        assert issubclass(cls, MugraphError)
    assert issubclass(mugraph.MissingDependencyError, ImportError)  # `except ImportError` holds
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


# A process in which a dependency cannot be imported (``sys.modules[name] = None`` makes its
# import fail as a missing package's does), then the code after it.
_WITHOUT = """
import sys
sys.modules[{name!r}] = None
import mugraph
g = mugraph.new_kernel_graph()
x = g.new_input(dims=(4, 16), dtype=mugraph.float16)
w = g.new_input(dims=(16, 16), dtype=mugraph.float16)
g.mark_output(g.exp(g.matmul(x, w)))
"""


def _run_without(name: str, code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", _WITHOUT.format(name=name) + code],
                          capture_output=True, text=True, timeout=300,
                          cwd=Path(__file__).resolve().parents[1])


def test_a_search_without_egglog_says_which_package_is_missing():
    done = _run_without("egglog", """
try:
    g.superoptimize(time_limit=5, workers=1)
except mugraph.MissingDependencyError as error:
    print("REFUSED", error)
""")
    assert "REFUSED" in done.stdout, done.stdout + done.stderr
    assert "egglog" in done.stdout and "pip install" in done.stdout


def test_the_cli_without_egglog_reports_it_as_an_error_not_an_internal_one(tmp_path):
    program = Path(__file__).resolve().parents[1] / "examples" / "programs" / "rmsnorm_linear.py"
    done = _run_without("egglog", f"""
from mugraph.cli import main
sys.exit(main(["optimize", {str(program)!r}, "--time-limit", "5", "--workers", "1",
               "--out", {str(tmp_path / "out")!r}]))
""")
    assert done.returncode != 0
    assert "MissingDependencyError" in done.stderr and "egglog" in done.stderr, done.stderr
    assert "internal error" not in done.stderr


def test_the_cross_checking_oracle_without_z3_says_which_package_is_missing():
    done = _run_without("z3", """
from mugraph.search.oracle import _z3
try:
    _z3()
except mugraph.MissingDependencyError as error:
    print("REFUSED", error)
""")
    assert "REFUSED" in done.stdout and "z3-solver" in done.stdout, done.stdout + done.stderr



def test_a_graph_without_custom_kernels_says_so_in_its_source():
    """Its compiled program's source was an empty string: now a comment naming the operators
    that run as PyTorch ops, and the program's repr names its kernels."""
    g = mugraph.new_kernel_graph()
    x, w = g.new_input(dims=(4, 8)), g.new_input(dims=(8, 16))
    g.mark_output(g.matmul(x, w))
    program = mugraph.compile(g)
    assert program.source.startswith("# no generated kernel") and "(matmul)" in program.source
    assert repr(program) == "CompiledProgram(kernels: none; PyTorch ops: matmul)"
