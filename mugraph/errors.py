"""The mugraph error hierarchy.

Every error mugraph raises on bad input derives from :class:`MugraphError`, names the operator
at fault and, where a graph is involved, shows the surrounding graph.
"""

from __future__ import annotations


class MugraphError(Exception):
    """Base class of every error mugraph raises on purpose."""


class ShapeError(MugraphError):
    """Tensor shapes do not fit an operator (matmul inner dims, broadcast, reshape size...)."""


class MapError(MugraphError):
    """An imap / omap / forloop_dim names a missing dim, does not divide it, or overlaps."""


class SharedMemoryError(MugraphError):
    """A block graph's shared-memory tensors exceed the GPU's per-block budget."""


class DTypeError(MugraphError):
    """An unsupported dtype, or operands whose dtypes do not agree."""


class GraphStructureError(MugraphError):
    """A graph is malformed: no output, a tensor from another graph, a phase mix-up..."""


class GraphInputError(MugraphError):
    """A graph was called with the wrong number, shapes, dtypes or devices of inputs."""


class UnsupportedError(MugraphError):
    """An operator, accumulator or option mugraph does not support."""


class SerializationError(MugraphError):
    """A JSON document is not a valid mugraph graph."""


class MissingDependencyError(MugraphError, ImportError):
    """A package mugraph depends on cannot be imported (a broken or partial installation):
    names the package, what needs it and how to install it."""
