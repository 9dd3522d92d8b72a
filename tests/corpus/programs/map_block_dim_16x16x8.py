"""Must be rejected: block_dim (16, 16, 8): 2048 threads."""

import mugraph


def program():
    return mugraph.new_threadblock_graph((1,), (16, 16, 8))
