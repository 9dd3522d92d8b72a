"""Must be rejected: reduction_dimx=-2."""

import mugraph


def program():
    return mugraph.new_threadblock_graph((1,), reduction_dimx=-2)
