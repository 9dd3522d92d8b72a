"""Must be rejected: block_dim (1025,): 1025 threads."""

import mugraph


def program():
    return mugraph.new_threadblock_graph((1,), (1025,))
