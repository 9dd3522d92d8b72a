"""Must be rejected: block_dim (32, 33): 1056 threads."""

import mugraph


def program():
    return mugraph.new_threadblock_graph((1,), (32, 33))
