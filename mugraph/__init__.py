"""mugraph: a multi-level superoptimizer for GPU tensor programs (after the Mirage paper)."""

from mugraph.cache import ResultCache, default_cache_dir
from mugraph.codegen.check import CodegenMismatchError
from mugraph.dtypes import DType, bfloat16, float16, float32
from mugraph.errors import (
    DTypeError,
    GraphInputError,
    GraphStructureError,
    MapError,
    MugraphError,
    SerializationError,
    ShapeError,
    SharedMemoryError,
    UnsupportedError,
)
from mugraph.gpu import H100, GPUSpec
from mugraph.ir.builder import (
    KernelGraph,
    ThreadBlockGraph,
    new_kernel_graph,
    new_threadblock_graph,
)
from mugraph.ir.graph import BlockGraph, Op
from mugraph.ir.ops import AccumKind, Group, Level, OpKind
from mugraph.ir.serialize import from_json
from mugraph.ir.tensor import DTensor, STensor, TensorType
from mugraph.ir.text import from_text, to_text
from mugraph.optimize.ranking import RankingOptions, RankingResult
from mugraph.persistent import PersistentKernel, PersistentProgram, build_decoder
from mugraph.runtime.compiled import CompiledProgram, compile_graph
from mugraph.search.config import SearchConfig
from mugraph.search.verify import NotVerifiableError, VerificationResult, verify

compile = compile_graph  # noqa: A001 - the upstream name: mugraph.compile(graph)

__version__ = "0.1.0"

__all__ = [
    "AccumKind",
    "BlockGraph",
    "CodegenMismatchError",
    "CompiledProgram",
    "ResultCache",
    "DTensor",
    "DType",
    "DTypeError",
    "GPUSpec",
    "GraphInputError",
    "GraphStructureError",
    "Group",
    "H100",
    "KernelGraph",
    "Level",
    "MapError",
    "MugraphError",
    "NotVerifiableError",
    "Op",
    "OpKind",
    "RankingOptions",
    "RankingResult",
    "PersistentKernel",
    "PersistentProgram",
    "STensor",
    "SearchConfig",
    "SerializationError",
    "ShapeError",
    "SharedMemoryError",
    "TensorType",
    "ThreadBlockGraph",
    "UnsupportedError",
    "VerificationResult",
    "bfloat16",
    "build_decoder",
    "compile",
    "default_cache_dir",
    "float16",
    "float32",
    "from_json",
    "from_text",
    "new_kernel_graph",
    "new_threadblock_graph",
    "to_text",
    "verify",
]


def _register_dynamo_backend() -> None:
    """Make ``torch.compile(..., backend="mugraph")`` work once torch's compiler is loaded
    (importing torch._dynamo here would cost seconds; installed copies also register through
    the package's torch_dynamo_backends entry point)."""
    import sys

    if "torch._dynamo" in sys.modules:
        from mugraph.integration import register_backend

        register_backend()


_register_dynamo_backend()
