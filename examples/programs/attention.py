"""Grouped-query attention for decoding: O = softmax(Q @ K) @ V, small shapes, float16.

Eight query heads share two KV heads (groups of four), one query token, head dim 16 and a
KV sequence of 128. K is given already transposed. Q is [h_kv, group, s, d], K is
[h_kv, 1, d, n] and V is [h_kv, 1, n, d]; the matmuls broadcast K and V over the group dim.
The paper's μGraph for this program (Fig 4c) is ``mugraph.library.attention_mirage_gqa``. On
two cores the search with the attention preset finds a two-kernel μGraph (the softmax
denominators first, then exp, division and both matmuls in one kernel) after about three
minutes.

    mugraph optimize examples/programs/attention.py --config attention --time-limit 300
"""

from __future__ import annotations

import mugraph

HEADS, KV_HEADS, SEQ, HEAD_DIM, KV_LEN = 8, 2, 1, 16, 128


def program() -> mugraph.KernelGraph:
    """The naive program: softmax written as exp / sum / div (no max subtraction)."""
    group = HEADS // KV_HEADS
    graph = mugraph.new_kernel_graph()
    q = graph.new_input((KV_HEADS, group, SEQ, HEAD_DIM), dtype=mugraph.float16)
    k = graph.new_input((KV_HEADS, 1, HEAD_DIM, KV_LEN), dtype=mugraph.float16)
    v = graph.new_input((KV_HEADS, 1, KV_LEN, HEAD_DIM), dtype=mugraph.float16)
    scores = graph.matmul(q, k)
    graph.mark_output(graph.matmul(graph.softmax(scores, dim=-1), v))
    return graph
