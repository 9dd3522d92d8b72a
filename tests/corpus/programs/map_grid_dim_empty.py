"""Must be rejected: grid_dim ()."""

import mugraph


def program():
    return mugraph.new_threadblock_graph(())
