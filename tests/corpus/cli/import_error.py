"""Must be rejected by `mugraph optimize`: the file imports a module that does not exist."""

import mugraph_no_such_module  # noqa: F401


def program():
    return None
