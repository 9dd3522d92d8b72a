"""mugraph: a multi-level superoptimizer for GPU tensor programs (after the Mirage paper)."""

from mugraph.dtypes import DType, bfloat16, float16, float32
from mugraph.errors import (
    DTypeError,
    GraphInputError,
    GraphStructureError,
    MapError,
    MissingDependencyError,
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
from mugraph.search.config import SearchConfig
from mugraph.search.verify import NotVerifiableError, VerificationResult, verify

# Names whose modules load on first use (code generation, the runtime, ranking, the cache
# and the persistent kernel): a search worker, which needs none of them, starts faster.
_LAZY = {
    "CodegenMismatchError": "mugraph.codegen.check",
    "CompiledProgram": "mugraph.runtime.compiled",
    "PersistentKernel": "mugraph.persistent",
    "PersistentProgram": "mugraph.persistent",
    "RankingOptions": "mugraph.optimize.ranking",
    "RankingResult": "mugraph.optimize.ranking",
    "ResultCache": "mugraph.cache",
    "build_decoder": "mugraph.persistent",
    "compile": "mugraph.runtime.compiled",  # compile_graph, under the upstream name
    "compile_graph": "mugraph.runtime.compiled",
    "default_cache_dir": "mugraph.cache",
}


def __getattr__(name: str):
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'mugraph' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module), "compile_graph" if name == "compile" else name)
    globals()[name] = value
    return value


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
    "MissingDependencyError",
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
