"""Must be rejected: block_dim ()."""

import mugraph


def program():
    return mugraph.new_threadblock_graph((1,), ())
