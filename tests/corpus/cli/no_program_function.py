"""Must be rejected by `mugraph optimize`: the file defines no program() function."""

x = 1
