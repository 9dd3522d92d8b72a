"""Must be rejected by `mugraph optimize`: program() returns something else than a graph."""


def program():
    return 42
