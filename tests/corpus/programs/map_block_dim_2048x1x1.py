"""Must be rejected: block_dim (2048, 1, 1): 2048 threads."""

import mugraph


def program():
    return mugraph.new_threadblock_graph((1,), (2048, 1, 1))
