"""A valid program (RMSNorm followed by a matmul) for the command-line entries of the corpus."""

import mugraph


def program():
    g = mugraph.new_kernel_graph()
    x = g.new_input((4, 32))
    w = g.new_input((32, 16))
    g.mark_output(g.matmul(g.rms_norm(x, 32), w))
    return g
