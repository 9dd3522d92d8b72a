"""Must be rejected: block_dim (1, 1, 1, 1)."""

import mugraph


def program():
    return mugraph.new_threadblock_graph((1,), (1, 1, 1, 1))
