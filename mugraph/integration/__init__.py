"""PyTorch integration: FX capture, partitioning, and the ``torch.compile`` backend.

``torch.compile(model, backend="mugraph", options={...})`` runs the parts of a model that
mugraph captures as superoptimized μGraphs and everything else on PyTorch (see
:mod:`mugraph.integration.dynamo` for the options). Importing this package registers the
backend name with Dynamo; the ``torch_dynamo_backends`` entry point does the same for an
installed mugraph.

``optimize_fx(gm, example_inputs, **options)`` does the same to a ``torch.fx.GraphModule``
(from ``torch.fx.symbolic_trace``) without Dynamo.
"""

from __future__ import annotations

from mugraph.integration.capture import CapturedProgram, Unsupported, build_program
from mugraph.integration.dynamo import (
    BackendOptionError,
    BackendOptions,
    MugraphCompiledGraph,
    mugraph_backend,
    optimize_fx,
    register_backend,
)
from mugraph.integration.partition import Partitioning, partition_graph
from mugraph.integration.report import (
    GraphReport,
    PartitionReport,
    clear_reports,
    last_report,
    reports,
)

register_backend()

__all__ = [
    "BackendOptionError",
    "BackendOptions",
    "CapturedProgram",
    "GraphReport",
    "MugraphCompiledGraph",
    "PartitionReport",
    "Partitioning",
    "Unsupported",
    "build_program",
    "clear_reports",
    "last_report",
    "mugraph_backend",
    "optimize_fx",
    "partition_graph",
    "register_backend",
    "reports",
]
