"""Must be rejected by `mugraph optimize`: program() raises an error of its own."""


def program():
    raise ValueError("broken on purpose")
