"""Must be rejected: block_dim 128."""

import mugraph


def program():
    return mugraph.new_threadblock_graph((1,), 128)
