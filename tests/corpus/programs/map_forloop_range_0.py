"""Must be rejected: forloop_range=0."""

import mugraph


def program():
    return mugraph.new_threadblock_graph((1,), forloop_range=0)
