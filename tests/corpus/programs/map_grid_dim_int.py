"""Must be rejected: grid_dim 4."""

import mugraph


def program():
    return mugraph.new_threadblock_graph(4)
