"""Must be rejected by `mugraph optimize`: the file is not valid Python."""

def program(:
