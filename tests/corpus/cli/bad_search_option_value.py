"""Must be rejected by `mugraph optimize`: SEARCH_OPTIONS gives an option a value no search can
use (a kernel of at most 0 blocks)."""

from tiny_program import program  # noqa: F401

SEARCH_OPTIONS = {"max_custom_kernels": 1, "max_blocks": 0}
