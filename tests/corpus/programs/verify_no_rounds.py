"""Must be rejected: verify with max_rounds=0. No round tests nothing; it used to answer
"equivalent"."""

import mugraph


def program():
    g = mugraph.new_kernel_graph()
    a = g.new_input((4, 8))
    g.mark_output(g.exp(a))
    return g
