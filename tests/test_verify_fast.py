"""The verifier's fast evaluation gives exactly the straightforward evaluation's values.

Fast (``FieldContext(fast=True)``, what ``verify`` and the search use): components computed
only when read, products and exponentials of the same memory computed once per round (also
across the two graphs, and in other tilings), whole products summed from split-K partial
products, ``(v · c) @ b`` as ``(v @ b) · c``, kernel operators applied again to the same values
shared, large inputs drawn as float64 mirrors, and the program's side of each round kept for
the search's candidates (:class:`ProgramRounds`). Straightforward (``fast=False``): every
operator computed as it comes, nothing shared. On random programs, the library's μGraphs and
every valid mutant of the mutation corpus, on the same draws, both must give the same outputs
(both components); fast evaluation may skip a division by zero in a component nothing reads,
never add one.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import test_verify as tv

from mugraph.library import WORKLOADS
from mugraph.search import verify as verify_module
from mugraph.search.verify import ProgramRounds, q_inputs
from mugraph.semantics.field import FieldInterpretation
from mugraph.semantics.field_arith import (
    FieldArray,
    FieldContext,
    FieldDivisionByZero,
    P,
    Q,
    matmul_mod,
    parallel_evaluation,
)
from mugraph.semantics.interpret import run_kernel_graph

SMALL = (23, 11)


def _outputs(graph, interp, inputs):
    try:
        outs = run_kernel_graph(interp, graph.ops, graph.outputs, inputs)
        return [(o.p.copy(), o.q.copy()) for o in outs]
    except FieldDivisionByZero as error:
        return error


def _both_ways(candidate, program, seed: int, primes=(P, Q)):
    """(straightforward, fast) outputs of (candidate, program) on the same draw."""
    q_needed = q_inputs(candidate) | q_inputs(program)
    results = []
    for fast in (False, True):
        rng = np.random.default_rng(seed)
        ctx, inputs = verify_module._draw_round(program, rng, q_needed, primes, None, fast)
        if fast:
            interp = FieldInterpretation(ctx)  # one context for both graphs, as verify does
            results.append([_outputs(g, interp, inputs) for g in (candidate, program)])
        else:
            results.append([_outputs(g, FieldInterpretation(ctx), inputs)
                            for g in (candidate, program)])
    return results


def _assert_same(plain, fast, label: str) -> str:
    """Exactly equal outputs; a division by zero only where the straightforward one has one."""
    outcome = "equal"
    for got_plain, got_fast in zip(plain, fast, strict=True):
        if isinstance(got_fast, FieldDivisionByZero):
            assert isinstance(got_plain, FieldDivisionByZero), f"{label}: fast divided by zero"
            outcome = "division by zero"
            continue
        if isinstance(got_plain, FieldDivisionByZero):
            outcome = "division by zero skipped"  # in a component that nothing reads
            continue
        for (pp, pq), (fp, fq) in zip(got_plain, got_fast, strict=True):
            np.testing.assert_array_equal(pp, fp, err_msg=f"{label}: Z_p differs")
            np.testing.assert_array_equal(pq, fq, err_msg=f"{label}: Z_q differs")
    return outcome


@pytest.fixture
def mirrors_everywhere(monkeypatch):
    """Every input drawn as a float64 mirror (not only large ones)."""
    monkeypatch.setattr(verify_module, "_MIRROR_MIN", 0)


def test_fast_equals_straightforward_on_random_programs(mirrors_everywhere):
    seen = {"equal": 0, "division by zero": 0, "division by zero skipped": 0}
    for n, (what, one, two, _) in enumerate(tv._program_pairs(seed=99, count=25)):
        if not (tv._valid(one) and tv._valid(two)):
            continue
        g1, g2 = tv.build([one]), tv.build([two])
        for primes in ((P, Q), SMALL):
            plain, fast = _both_ways(g1, g2, seed=n, primes=primes)
            seen[_assert_same(plain, fast, f"{what}: {one} vs {two} over {primes}")] += 1
    assert seen["equal"] >= 60 and seen["division by zero"] >= 1, seen


def _library_cases():
    for name, work in sorted(WORKLOADS.items()):
        yield name, work.small
        for sizes in tv.EXTRA_SIZES.get(name, ()):
            yield name, sizes


def test_fast_equals_straightforward_on_the_library_and_its_mutants(mirrors_everywhere):
    compared = 0
    for name, sizes in _library_cases():
        work = WORKLOADS[name]
        program = work.naive(sizes)
        graphs = [work.optimized(sizes)]
        graphs += [g for g in (tv._build(m, program) for m in tv.mutants(graphs[0])) if g]
        for i, graph in enumerate(graphs):
            plain, fast = _both_ways(graph, program, seed=i)
            _assert_same(plain, fast, f"{name} {sizes} graph {i}")
            compared += 1
    assert compared >= 200, compared


def test_shared_products_and_exponentials_are_exact():
    rng = np.random.default_rng(4)
    ctx = FieldContext.from_rng(rng, fast=True)
    plain = ctx.with_fast(False)
    # a tiled view of Q @ K (as a block graph's tiles fold back) hits the memo of Q @ K
    q, k = ctx.random((2, 8, 4), rng), ctx.random((2, 4, 32), rng)
    whole = ctx.matmul(q, k)
    tiles = k.index_map(lambda a: a.reshape(2, 4, 4, 8).transpose(2, 0, 1, 3))  # 4 column tiles
    tiled = ctx.matmul(q.index_map(lambda a: a[None]), tiles)
    np.testing.assert_array_equal(whole.q, plain.matmul(q, k).q)
    np.testing.assert_array_equal(tiled.p, plain.matmul(q.index_map(lambda a: a[None]), tiles).p)
    # exp of a transposed view of a product is the same view of the product's exp
    e_view = ctx.exp(whole.index_map(lambda a: a.transpose(0, 2, 1)))
    np.testing.assert_array_equal(e_view.p, plain.exp(whole).p.transpose(0, 2, 1))
    # split-K partial products give the whole product
    x, y = ctx.random((3, 64), rng), ctx.random((64, 5), rng)
    parts = ctx.matmul(x.index_map(lambda a: a.reshape(3, 4, 16).transpose(1, 0, 2)),
                       y.index_map(lambda a: a.reshape(4, 16, 5)))
    parts.p, parts.q  # noqa: B018 - computes them: the whole product is kept now
    before = len(ctx.memo)
    np.testing.assert_array_equal(ctx.matmul(x, y).p, matmul_mod(x.p, y.p, P))
    np.testing.assert_array_equal(ctx.matmul(x, y).q, matmul_mod(x.q, y.q, Q))
    assert len(ctx.memo) == before  # came from the memo
    # (v · c) @ b with c constant along the reduction dim, and a @ (w · d)
    v, c, b = ctx.random((6, 7), rng), ctx.random((6, 1), rng), ctx.random((7, 3), rng)
    w, d = ctx.random((7, 3), rng), ctx.random((3,), rng)
    for got, want in ((ctx.matmul(ctx.mul(v, c), b), plain.matmul(plain.mul(v, c), b)),
                      (ctx.matmul(v, ctx.mul(w, d)), plain.matmul(v, plain.mul(w, d)))):
        assert got.equals(want)
    # x @ (y @ z) as (x @ y) @ z when y @ z is large and not computed (and the mirror case)
    x, y, z = (ctx.random(s, rng) for s in ((2, 64), (64, 4), (4, 64)))
    yz = plain.matmul(y, z)
    for left in (True, False):
        product = ctx.matmul(y, z)
        got = ctx.matmul(x, product) if left else ctx.matmul(product, x.transpose(1, 0))
        want = plain.matmul(x, yz) if left else plain.matmul(yz, x.transpose(1, 0))
        assert got.equals(want) and product.computed_part("p") is None


def test_products_of_equal_values_in_other_memory_are_shared_and_exact():
    """Operands holding the same values in other memory (one graph's normalised Q and K
    written by a kernel, the other's computed as it comes) give the memo's product; operands
    of the same shape that differ anywhere (a sampled row or elsewhere) do not."""
    rng = np.random.default_rng(9)
    ctx = FieldContext.from_rng(rng, fast=True)
    plain = ctx.with_fast(False)
    q, k = ctx.random((2, 8, 4), rng), ctx.random((2, 4, 32), rng)
    first = ctx.matmul(q, k)
    first.p, first.q  # noqa: B018
    before = len(ctx.memo)
    copies = [FieldArray(x.p.copy(), x.q.copy()) for x in (q, k)]
    again = ctx.matmul(*copies)
    assert again.equals(first) and again.p.base is first.p.base  # the same product's memory
    assert len(ctx.memo) == before + 2  # the copies' keys (p and q), no new product
    for index in ((0, 0, 0), (1, 3, 31), (1, 2, 17)):  # sampled rows, and a middle element
        changed = k.p.copy()
        changed[index] = (changed[index] + 1) % P
        other = FieldArray(changed, k.q.copy())
        got = ctx.matmul(copies[0], other)
        np.testing.assert_array_equal(got.p, plain.matmul(q, other).p)
        assert not np.array_equal(got.p, first.p)


def test_squares_are_shared_across_layouts_including_as_strided_tiles():
    """x² of a value and of an as_strided tile view of it (how the driver partitions a block
    input, with zero strides on its size-1 axes) is computed once and is exact."""
    rng = np.random.default_rng(11)
    ctx = FieldContext.from_rng(rng, fast=True)
    k = ctx.random((4, 8, 16), rng)
    whole = ctx.mul(k, k)
    whole.p, whole.q  # noqa: B018
    tiles = k.index_map(lambda a: np.lib.stride_tricks.as_strided(
        a, (1, 4, 2, 1, 8, 8), (0, a.strides[0], 8 * a.strides[2], 0, a.strides[1],
                                a.strides[2])))
    squared = ctx.mul(tiles, tiles)
    assert np.shares_memory(squared.p, whole.p) and np.shares_memory(squared.q, whole.q)
    for name, m in (("p", P), ("q", Q)):
        tile = getattr(tiles, name)
        np.testing.assert_array_equal(getattr(squared, name), tile * tile % m)


def test_norm_scales_before_a_larger_product_are_applied_to_the_operands():
    """(v · c) @ b is computed as it is written when the product is larger than v · c (a norm
    before Q @ K), and as (v @ b) · c when that product is in the memo already: the same
    values either way."""
    rng = np.random.default_rng(10)
    ctx = FieldContext.from_rng(rng, fast=True)
    plain = ctx.with_fast(False)
    v, c, b = ctx.random((2, 8, 4), rng), ctx.random((2, 8, 1), rng), ctx.random((2, 4, 64), rng)
    scaled = ctx.mul(v, c)
    got = ctx.matmul(scaled, b)
    assert got.equals(plain.matmul(plain.mul(v, c), b))
    assert scaled.computed_part("q") is not None  # the operand was scaled, not the product
    ctx2 = FieldContext.from_rng(np.random.default_rng(10), fast=True)
    v2, c2, b2 = (ctx2.random(x.shape, rng2) for x, rng2 in
                  ((v, np.random.default_rng(1)), (c, np.random.default_rng(2)),
                   (b, np.random.default_rng(3))))
    unscaled = ctx2.matmul(v2, b2)
    unscaled.p, unscaled.q  # noqa: B018 - the other graph's product of v
    scaled2 = ctx2.mul(v2, c2)
    got2 = ctx2.matmul(scaled2, b2)
    assert got2.equals(ctx2.with_fast(False).matmul(ctx2.with_fast(False).mul(v2, c2), b2))
    assert scaled2.computed_part("q") is None  # the product was scaled instead


def test_float64_mirrors_hold_the_same_values():
    ctx = FieldContext.from_rng(np.random.default_rng(1), fast=True)
    plain_ctx = ctx.with_fast(False)
    for shape, with_q in (((3, 1 << 19), True), ((700,), False)):  # one large: drawn in parts
        with parallel_evaluation(2):
            mirrored = ctx.random(shape, np.random.default_rng(8), with_q=with_q, mirror=True)
            assert not mirrored.computed  # drawn when read
            drawn = mirrored.gemm_part("p")
        plain = plain_ctx.random(shape, np.random.default_rng(8), with_q=with_q)
        assert drawn.dtype == np.float64 and plain.p.dtype == np.int64
        np.testing.assert_array_equal(drawn, plain.p)
        assert mirrored.equals(plain)
    w = ctx.random((40, 30), np.random.default_rng(2), mirror=True)
    x = ctx.random((5, 40), np.random.default_rng(3))
    np.testing.assert_array_equal(matmul_mod(x.p, w.gemm_part("p"), P), matmul_mod(x.p, w.p, P))
    np.testing.assert_array_equal(matmul_mod(w.gemm_part("q").T, x.q.T, Q),
                                  matmul_mod(w.q.T, x.q.T, Q))
    # a component nothing reads is never drawn
    k = ctx.random((40, 30), np.random.default_rng(2), mirror=True)
    logits = ctx.matmul(ctx.random((3, 8), np.random.default_rng(4)), k.index_map(lambda a: a[:8]))
    ctx.exp(logits).p  # noqa: B018
    assert k.computed_part("p") is None and k.mirrors[0].value is None
    assert k.mirrors[1].value is not None


def test_deferred_components_are_computed_only_when_read():
    ctx = FieldContext.from_rng(np.random.default_rng(5), fast=True)
    x = ctx.random((4, 4), np.random.default_rng(6))
    zero = FieldArray(np.ones((4, 4), np.int64), np.zeros((4, 4), np.int64))
    quotient = ctx.div(x, zero)  # Z_q divisor all zero: only reading .q divides by zero
    np.testing.assert_array_equal(quotient.p, x.p)
    with pytest.raises(FieldDivisionByZero):
        quotient.q  # noqa: B018
    logits = ctx.matmul(x, x)
    ctx.exp(logits).p  # noqa: B018 - exp reads only the Z_q component of its argument
    assert logits.computed_part("q") is not None and logits.computed_part("p") is None


def test_program_rounds_verify_as_verify_does():
    for name, work in sorted(WORKLOADS.items()):
        program = work.naive(work.small)
        rounds = ProgramRounds(program, seed=3)
        good = rounds.verify(work.optimized(work.small), max_rounds=3)
        again = rounds.verify(work.optimized(work.small), max_rounds=3)  # from the kept rounds
        assert good.passed and again.passed, (name, str(good))
        plan = verify_module.verify(work.optimized(work.small), program, max_rounds=3, seed=0)
        assert (good.rounds, good.bound, good.guarantee) == (plan.rounds, plan.bound,
                                                             plan.guarantee)
        rejected = 0
        for mutant in tv.mutants(work.optimized(work.small)):
            graph = tv._build(mutant, program)
            if graph is None or not tv.float_differs(graph, program):
                continue
            result = rounds.verify(graph, max_rounds=3)
            assert not result.passed, (name, mutant.what, str(result))
            rejected += 1
            if rejected == 6:
                break
        assert rejected >= 3, name
    assert rounds._rounds and rounds._kept <= rounds.max_bytes


def test_program_rounds_without_memory_and_with_extra_q_inputs():
    # a candidate dividing by an input the program only multiplies: it needs that input's
    # Z_q component, which the kept rounds do not have: it gets fresh rounds
    program = tv._graph([(3, 4), (3, 4)], lambda g, x, y: g.mul(x, y))
    candidate = tv._graph([(3, 4), (3, 4)],
                          lambda g, x, y: g.div(x, g.div(g.mul_scalar(y, 0.5), g.mul(y, y))))
    same = tv._graph([(3, 4), (3, 4)], lambda g, x, y: g.mul(y, x))
    for max_bytes in (0, 1 << 20):
        rounds = ProgramRounds(program, seed=1, max_bytes=max_bytes)
        assert not q_inputs(candidate) <= rounds.q_needed
        assert not rounds.verify(candidate, max_rounds=4).passed
        assert rounds.verify(same, max_rounds=4).passed
        assert (len(rounds._rounds) > 0) == (max_bytes > 0)
    assert math.isfinite(rounds.verify(same).bound)


def _products_computed(monkeypatch) -> list:
    """Every product the field arithmetic computes from now on (their operand shapes)."""
    from mugraph.semantics import field_arith

    made, core = [], field_arith._matmul_core

    def counting(xf, yf, m, limbs):
        made.append((xf.shape, yf.shape))
        return core(xf, yf, m, limbs)

    monkeypatch.setattr(field_arith, "_matmul_core", counting)
    return made


def test_program_rounds_keep_candidates_products_of_the_rounds_memory(monkeypatch):
    """Split-KV attention multiplies E[:, part] @ V[part, :], which the program (E @ V whole)
    never computes: the first check of a candidate computes those products on the round's
    own memory and keeps them, so the next candidate with the same split computes none —
    and gets the same answers (a mutant is still rejected); with no memory to spare for
    them, nothing is kept."""
    work = WORKLOADS["attention_flashdecoding"]
    program, candidate = work.naive(work.small), work.optimized(work.small)
    made = _products_computed(monkeypatch)
    rounds = ProgramRounds(program, seed=5)
    first = rounds.verify(candidate, max_rounds=2)
    programs_own = len(made)
    assert first.passed and programs_own > 0
    kept = [r.kept for r in rounds._rounds]
    assert all(k is not None and k.entries for k in kept)
    made.clear()
    again = rounds.verify(candidate, max_rounds=2)
    assert again.passed and made == []  # every product found kept
    assert (again.rounds, again.guarantee) == (first.rounds, first.guarantee)
    assert rounds._kept <= rounds.max_bytes
    mutant = next(tv._build(m, program) for m in tv.mutants(candidate)
                  if tv._build(m, program) is not None
                  and tv.float_differs(tv._build(m, program), program))  # fmt: skip
    assert not rounds.verify(mutant, max_rounds=2).passed

    monkeypatch.setattr(verify_module, "KEPT_PRODUCTS_SHARE", 1 << 40)  # no room for them
    bare = ProgramRounds(program, seed=5)
    assert bare.verify(candidate, max_rounds=2).passed
    made.clear()
    assert bare.verify(candidate, max_rounds=2).passed and made
    assert all(not r.kept.entries for r in bare._rounds)


def test_kept_products_are_those_of_the_rounds_memory_within_their_room():
    from mugraph.semantics.field_arith import KeptProducts

    def product(x, y):
        return (("matmul", 7, None, id(x), id(y)), (x, y, np.ones((x.shape[0], y.shape[1]),
                                                                  dtype=np.int64)))  # fmt: skip

    a, b = np.ones((4, 8), dtype=np.int64), np.ones((8, 2), dtype=np.int64)
    own = np.ones((4, 8), dtype=np.int64)  # a candidate's own array: not the round's
    round_memo = dict([product(a, b)])
    kept = KeptProducts(round_memo, max_bytes=1 << 20)
    on_views, on_own = product(a[:, :4], b[:4]), product(own, b)
    candidate_memo = {**round_memo, **dict([on_views, on_own])}
    assert kept.keep(candidate_memo, round_memo, room=1 << 20) == 64
    assert list(kept.entries) == [on_views[0]]  # views of the round's arrays count as its
    # a product of a kept product is the round's too; no room, nothing kept
    later = product(on_views[1][2], np.ones((2, 3), dtype=np.int64))
    assert kept.keep({**candidate_memo, **dict([later])}, round_memo, room=0) == 0
    chained = product(on_views[1][2], b[:2])
    assert kept.keep(dict([chained]), round_memo, room=1 << 20) == 64
    assert kept.nbytes == 128 and chained[0] in kept.entries


def test_sums_of_the_rounds_memory_are_kept_apart_from_products(monkeypatch):
    """A sum over the round's memory that shrinks it at least KEPT_SUM_MIN_RATIO-fold is kept
    (a second ask computes nothing and gets the same values); a sum of a candidate's own
    array, or one that shrinks too little, is not; sums have a budget of their own, so they
    never take the products' room."""
    from mugraph.semantics import field_arith
    from mugraph.semantics.field_arith import KeptProducts, sum_mod

    monkeypatch.setattr(field_arith, "KEPT_SUM_MIN_ELEMENTS", 16)
    monkeypatch.setattr(field_arith, "KEPT_SUM_MIN_RATIO", 8)
    rng = np.random.default_rng(3)
    exp_like = rng.integers(0, 97, size=(8, 4, 64), dtype=np.int64)  # the round's memory
    kept = KeptProducts({("exp", 0): (exp_like, exp_like)}, max_bytes=1 << 20)
    tiles = exp_like.reshape(8, 4, 8, 8).transpose(2, 0, 1, 3)  # loop axis first
    calls = []
    monkeypatch.setattr(field_arith, "sum_mod",
                        lambda *a, **k: calls.append(1) or sum_mod(*a, **k))  # fmt: skip
    first = kept.summed(tiles, 97, 0, True)
    again = kept.summed(exp_like.reshape(8, 4, 8, 8).transpose(2, 0, 1, 3), 97, 0, True)
    assert again is first and len(calls) == 1 and len(kept.sums) == 1
    assert np.array_equal(first, sum_mod(tiles, 97, axis=0, keepdims=True))
    assert kept.sum_bytes == first.nbytes and kept.nbytes == 0  # the products' room is whole
    kept.summed(exp_like.copy(), 97, 2, False)  # a candidate's own array: not kept
    kept.summed(exp_like, 97, 0, False)  # 8 elements into each: kept
    kept.summed(exp_like, 97, 1, False)  # 4 elements into each: not kept
    assert len(kept.sums) == 2 and len(calls) == 4
    assert kept.keep({}, {}, room=1 << 20) == kept.sum_bytes  # counted once in the rounds
    assert kept.keep({}, {}, room=1 << 20) == 0
    small = KeptProducts({("exp", 0): (exp_like, exp_like)}, max_bytes=1 << 20,
                         max_sum_bytes=first.nbytes)
    small.summed(exp_like, 97, 0, True)
    small.summed(exp_like, 97, 2, True)  # past the sums' own budget: not kept
    assert len(small.sums) == 1 and small.sum_bytes == first.nbytes


class _CountingStore:
    """A SharedArrays stand-in in memory that counts what it is asked."""

    def __init__(self) -> None:
        self.arrays, self.loads, self.saves = {}, 0, 0

    def load(self, key):
        self.loads += 1
        return self.arrays.get(key)

    def save(self, key, value):
        self.saves += 1
        self.arrays.setdefault(key, value)


def _verify_in_child(rounds, candidate, made):
    """Verify ``candidate`` on ``rounds`` in a forked process: (passed, rounds, guarantee,
    products it computed, the store's counts there)."""
    import multiprocessing

    def run(conn):
        result = rounds.verify(candidate, max_rounds=2)
        conn.send((result.passed, result.rounds, result.guarantee, len(made),
                   rounds.shared.counts()))
        conn.close()

    ctx = multiprocessing.get_context("fork")
    receive, send = ctx.Pipe(duplex=False)
    child = ctx.Process(target=run, args=(send,))
    child.start()
    out = receive.recv()
    child.join(30)
    return out


def test_forked_processes_share_products_of_the_rounds_they_inherited(monkeypatch, tmp_path):
    """Workers forked after the rounds were drawn hold the rounds' memory at the same
    addresses: the first to check a split-KV candidate computes its partial products and
    writes them to the search's store, the next reads them instead of computing them — with
    the same answers. The process that drew the rounds shares nothing."""
    from mugraph.search.memo import SharedArrays

    work = WORKLOADS["attention_flashdecoding"]
    program, candidate = work.naive(work.small), work.optimized(work.small)
    rounds = ProgramRounds(program, seed=5, shared=SharedArrays(tmp_path))
    assert rounds.prepare(2) == 2
    made = _products_computed(monkeypatch)
    first = _verify_in_child(rounds, candidate, made)
    second = _verify_in_child(rounds, candidate, made)
    assert first[:3] == second[:3] and first[0]
    assert first[3] > 0 and first[4]["kept_shared"] == 0
    assert second[3] == 0 and second[4]["kept_shared"] == first[3]
    assert len(list(tmp_path.glob("*.arr"))) == first[3]
    mutant = next(tv._build(m, program) for m in tv.mutants(candidate)
                  if tv._build(m, program) is not None
                  and tv.float_differs(tv._build(m, program), program))  # fmt: skip
    assert not _verify_in_child(rounds, mutant, made)[0]
    files = len(list(tmp_path.glob("*.arr")))
    assert rounds.verify(candidate, max_rounds=2).passed  # the drawing process: no sharing
    assert rounds.shared.counts()["kept_shared"] == 0
    assert len(list(tmp_path.glob("*.arr"))) == files


def test_only_products_of_the_memory_a_round_held_when_made_are_shared():
    from mugraph.semantics.field_arith import KeptProducts, _ident, _product_key

    a, b = np.ones((4, 8), dtype=np.int64), np.ones((8, 2), dtype=np.int64)
    kept = KeptProducts({("exp", 0): (a, a)}, b, max_bytes=1 << 20)
    store = _CountingStore()
    own_key = _product_key(a[:, :4], b[:4], 7, None)
    assert kept.shared_product(own_key) is None and store.loads == 0  # no store yet
    kept.share_through(store, "round-1")
    later = np.ones((4, 8), dtype=np.int64)  # made after the round: not the round's memory
    assert kept.shared_product(_product_key(later, b, 7, None)) is None and store.loads == 0
    assert kept.shared_product(own_key) is None and store.loads == 1
    product = np.full((4, 2), 3, dtype=np.int64)
    store.arrays[("round-1", own_key)] = product
    assert kept.shared_product(own_key) is product
    # keep() writes what it keeps of the round's own memory, but not what it read
    entries = {own_key: (a[:, :4], b[:4], product),
               _product_key(a, b, 7, None): (a, b, np.zeros((4, 2), dtype=np.int64)),
               _product_key(later, b, 7, None): (later, b, np.zeros((4, 2), dtype=np.int64))}
    kept.keep(entries, {}, room=1 << 20)
    assert store.saves == 1 and ("round-1", _product_key(a, b, 7, None)) in store.arrays
    assert _ident(a)[0] != _ident(later)[0]


def test_shared_arrays_ignore_missing_truncated_and_foreign_files(tmp_path):
    from mugraph.search.memo import SharedArrays

    store = SharedArrays(tmp_path)
    value = np.arange(12, dtype=np.int64).reshape(3, 4)
    assert store.load(("s", 1)) is None
    store.save(("s", 1), value.T)  # any layout: stored in C order
    got = store.load(("s", 1))
    assert np.array_equal(got, value.T) and got.dtype == value.dtype
    assert not got.flags.writeable  # mapped read-only: a kept array is never written
    store.save(("s", 1), value.T + 1)  # written once: the first stays
    assert np.array_equal(store.load(("s", 1)), value.T)
    store.save(("s", 3), np.zeros((0, 4)))
    assert store.load(("s", 3)).shape == (0, 4)
    data = store._path(("s", 1)).read_bytes()
    path = store._path(("s", 2))
    path.write_bytes(data)  # another key's file
    assert store.load(("s", 2)) is None
    store._path(("s", 1)).write_bytes(data[:-8])  # truncated
    assert store.load(("s", 1)) is None
    path.write_bytes(b"not an array file")
    assert store.load(("s", 2)) is None
    assert store.counts()["kept_shared"] == 3


def test_sums_that_would_be_kept_are_shared_through_the_store(monkeypatch):
    """Two workers' KeptProducts of one round (here: of the same memory in one process):
    the first computes a sum of the round's memory and stores it, the second reads it; a
    sum too small to keep, or of memory made later, is neither stored nor asked for."""
    from mugraph.semantics import field_arith
    from mugraph.semantics.field_arith import KeptProducts, sum_mod

    monkeypatch.setattr(field_arith, "KEPT_SUM_MIN_ELEMENTS", 16)
    weight = np.random.default_rng(4).integers(0, 97, size=(4, 64, 8), dtype=np.int64)
    store = _CountingStore()
    workers = [KeptProducts({}, weight, max_bytes=1 << 20) for _ in range(2)]
    for kept in workers:
        kept.share_through(store, "round-1")
    calls = []
    monkeypatch.setattr(field_arith, "sum_mod",
                        lambda *a, **k: calls.append(1) or sum_mod(*a, **k))  # fmt: skip
    first = workers[0].summed(weight, 97, 0, True)  # the loop's four tiles summed
    second = workers[1].summed(weight, 97, 0, True)
    assert len(calls) == 1 and store.saves == 1 and store.loads == 2
    assert np.array_equal(first, second) and np.array_equal(second, sum_mod(weight, 97, 0,
                                                                             keepdims=True))
    workers[1].summed(weight[:1], 97, 0, True)  # one tile: nothing to gain
    workers[1].summed(weight.copy(), 97, 0, True)  # memory made after the round
    assert store.loads == 2 and store.saves == 1 and len(calls) == 3
