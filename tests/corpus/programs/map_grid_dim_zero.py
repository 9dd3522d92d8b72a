"""Must be rejected: grid_dim (2, 0)."""

import mugraph


def program():
    return mugraph.new_threadblock_graph((2, 0))
