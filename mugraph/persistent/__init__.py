"""Whole-model decode as one persistent kernel (issue 14; after seed 003's persistent kernel).

- :class:`PersistentKernel` builds a decode step layer by layer; every layer is a set of
  custom kernels defined by block graphs (:mod:`mugraph.persistent.layers`).
- :func:`build_task_graph` turns its kernel graph into tasks, events and per-program queues
  with tile-granular dependencies (:mod:`mugraph.persistent.taskgraph`).
- :class:`PersistentProgram` generates one persistent Triton kernel whose task bodies come from
  mugraph's code generator, and runs it: two programs per SM on a GPU (as many as are
  resident), a topological order under the CPU interpreter (:mod:`mugraph.persistent.runtime`).
- :func:`build_decoder` builds the kernel from a transformers Llama / Mistral / Qwen2 /
  Qwen3 model.
"""

from mugraph.persistent.hf import Decoder, ModelShape, build_decoder
from mugraph.persistent.kernel import KernelRole, PersistentKernel, RopeTables, TilePolicy
from mugraph.persistent.parallel import Peer, simulate_ranks
from mugraph.persistent.runtime import PersistentProgram, PersistentRuntimeError
from mugraph.persistent.taskgraph import TaskGraph, block_dependencies, build_task_graph
from mugraph.persistent.tensors import MetaSlot, PTensor

__all__ = [
    "Decoder",
    "KernelRole",
    "MetaSlot",
    "ModelShape",
    "PTensor",
    "Peer",
    "PersistentKernel",
    "PersistentProgram",
    "PersistentRuntimeError",
    "RopeTables",
    "TaskGraph",
    "TilePolicy",
    "block_dependencies",
    "build_decoder",
    "build_task_graph",
    "simulate_ranks",
]
