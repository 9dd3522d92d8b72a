"""Must be rejected: forloop_range=1.5."""

import mugraph


def program():
    return mugraph.new_threadblock_graph((1,), forloop_range=1.5)
