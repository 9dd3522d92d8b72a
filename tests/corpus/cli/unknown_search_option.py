"""Must be rejected by `mugraph optimize`: SEARCH_OPTIONS names an option that does not exist."""

from tiny_program import program  # noqa: F401

SEARCH_OPTIONS = {"max_custom_kernels": 1, "speed": 11}
