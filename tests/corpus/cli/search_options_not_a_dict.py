"""Must be rejected by `mugraph optimize`: SEARCH_OPTIONS is not a dict."""

from tiny_program import program  # noqa: F401

SEARCH_OPTIONS = ["max_custom_kernels", 1]
