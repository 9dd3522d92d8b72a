"""The rows of the suite (``benchmarks/SUITE.md``): every workload of groups A and B at both
of its batch factors, with the sizes of its program, the tile sizes of the hand-written
μGraph that stands in for it when the search found none, and small sizes for CPU checks.

Row names are ``<workload>_b<b>``; :func:`select` picks rows by row name, workload name or
group.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from benchmarks.suite.programs import FAMILIES, Family, Sizes

KV_TOKENS = 4096


@dataclass(frozen=True)
class Row:
    """One workload at one batch factor.

    sizes: the program's sizes (see :mod:`benchmarks.suite.programs`); tiles: the
    hand-written μGraph's tile sizes at those sizes; small / small_tiles: scaled-down sizes
    (same divisibility) for checks on the Triton interpreter; shapes: the suite's inputs in
    words; layout: how the row lays out the suite's tensors in its program.
    """

    name: str
    workload: str
    group: str
    b: int
    family_name: str
    sizes: Sizes
    tiles: Sizes
    small: Sizes
    small_tiles: Sizes
    shapes: str
    layout: str = ""
    variants: tuple[Sizes, ...] = field(default=())

    @property
    def family(self) -> Family:
        return FAMILIES[self.family_name]

    @property
    def attention(self) -> bool:
        return self.family.attention

    def program(self, small: bool = False, dtype=None):
        """The naive mugraph program at the row's (or its small) sizes."""
        sizes = self.small if small else self.sizes
        return self.family.program(sizes) if dtype is None else self.family.program(sizes, dtype)

    def counts(self, small: bool = False) -> tuple[int, int]:
        """(bytes that must move, matmul flops) of the program."""
        return self.family.counts(self.small if small else self.sizes)

    def torch_fn(self, *inputs):
        return self.family.torch_fn(*inputs)


# ---- tile choices -----------------------------------------------------------------------------


def _attention_parts(s: Sizes, s_parts: int, n_tile: int, target_blocks: int) -> int:
    """KV split giving about ``target_blocks`` blocks, each part at least two chunks long."""
    parts = 1
    while s["h"] * parts * s_parts < target_blocks and parts * 2 * n_tile * 2 <= s["n"]:
        parts *= 2
    return parts


def attention_tilings(s: Sizes, target_blocks: int = 256, limit: int = 8) -> list[Sizes]:
    """Tilings of the library's split-KV attention for [h, s, d] x [h, d, n], the preferred
    first: 32 query rows per block where they divide (else 16, 64, all rows, or one row when
    the row count has no such divisor), KV chunks of 64 (32 as an alternative: 128 spills),
    the KV split giving about ``target_blocks`` blocks (or half that). On an H100, gqa_b1
    ran 22 µs with 32 rows and 16 parts against 34-43 µs with 64 rows and 458 µs with
    128-long chunks."""
    rows = s["s"]
    row_options = [r for r in (32, 16, 64) if rows % r == 0 and r < rows]
    if rows <= 128:
        row_options.append(rows)
    if rows > 16 and not any(rows % r == 0 for r in (16, 32, 64)):
        row_options.append(1)
    out = []
    for n_tile in (64, 32):
        for r in row_options:
            s_parts = rows // r
            parts = _attention_parts(s, s_parts, n_tile, target_blocks)
            for p in (parts, parts // 2):
                if p >= 1 and s["n"] % (p * n_tile) == 0:
                    out.append({"parts": p, "n_tile": n_tile, "s_parts": s_parts,
                                "h_tile": 1, "h_tile2": 1})
    unique = [dict(t) for t in dict.fromkeys(tuple(sorted(t.items())) for t in out)]
    unique.sort(key=lambda t: (t["n_tile"] != 64, t["parts"] != _attention_parts(
        s, t["s_parts"], t["n_tile"], target_blocks)))
    return unique[:limit]


# ---- the table ---------------------------------------------------------------------------------


def _attention_row(workload, group, b, family, sizes, small, small_tiles, shapes, layout) -> Row:
    tiles, *variants = attention_tilings(sizes)
    return Row(f"{workload}_b{b}", workload, group, b, family, sizes, tiles, small,
               {"h_tile": 1, "h_tile2": 1, **small_tiles}, shapes, layout, tuple(variants))


def _group_a_attention(workload: str, family: str, heads: int, rows: int, b: int) -> Row:
    h = heads * b
    sizes = {"h": h, "s": rows, "d": 64, "n": KV_TOKENS, "k_nd": 0}
    small_h = min(heads, 2) * (1 if b == 1 else 2)
    small_rows = {16: 16, 256: 32, 1024: 64}[rows]
    small = {"h": small_h, "s": small_rows, "d": 16, "n": 128, "k_nd": 0}
    small_tiles = {"parts": 2, "n_tile": 32, "s_parts": max(1, small_rows // 16)}
    shapes = f"Q ({h}, {rows}, 64), K ({h}, 64, {KV_TOKENS}), V ({h}, {KV_TOKENS}, 64)"
    layout = "as given; K stored [h, d, n]"
    return _attention_row(workload, "A", b, family, sizes, small, small_tiles, shapes, layout)


def _group_b_attention(workload: str, q_heads: int, kv_heads: int, tokens: int, d: int,
                       b: int) -> Row:
    group = q_heads // kv_heads
    sizes = {"h": kv_heads * b, "s": group * tokens, "d": d, "n": KV_TOKENS, "k_nd": 1,
             "batch": b, "kv_heads": kv_heads, "group": group, "tokens": tokens}
    small_kv = 1 if b == 1 else 2
    small_s = group * min(tokens, 4)
    small = {"h": small_kv * kv_heads, "s": small_s, "d": 32 if d == 128 else 16, "n": 128,
             "k_nd": 1, "batch": small_kv, "kv_heads": kv_heads, "group": group,
             "tokens": min(tokens, 4)}
    small_tiles = {"parts": 2, "n_tile": 32, "s_parts": 2 if small_s % 32 == 0 else 1}
    shapes = (f"Q ({b}, {q_heads}, {tokens}, {d}), K, V ({b}, {kv_heads}, {KV_TOKENS}, {d})")
    layout = (f"query heads folded into rows: Q [{kv_heads * b}, {group}x{tokens}, {d}]; "
              f"K stored [.., n, d], read as a transposed view")
    return _attention_row(workload, "B", b, "attention", sizes, small, small_tiles, shapes,
                          layout)


def _matmul_row(workload, group, b, family, sizes, tiles, small, small_tiles, shapes,
                variants=()) -> Row:
    return Row(f"{workload}_b{b}", workload, group, b, family, sizes, tiles, small, small_tiles,
               shapes, "as given", tuple(variants))


def _tile_variants(sizes: Sizes, tiles: Sizes, **choices) -> list[Sizes]:
    """Overrides of ``tiles`` (one key at a time) that divide the row's dims."""
    out = []
    for key, values in choices.items():
        for value in values:
            trial = {**tiles, key: value}
            if trial != tiles and all(
                sizes[dim] % trial[t] == 0 for t, dim in (("k_tile", "k"), ("n_tile", "n"))
                if t in trial
            ):
                out.append(trial)
    return out


def _rmsnorm_linear(workload: str, group: str, b: int, m: int) -> Row:
    sizes = {"m": m, "k": 4096, "n": 6144}
    tiles = {"k_tile": 256, "n_tile": 64}
    small = {"m": m if m <= 16 else 16, "k": 256, "n": 96}
    return _matmul_row(workload, group, b, "rmsnorm_linear", sizes, tiles, small,
                       {"k_tile": 64, "n_tile": 32}, f"X ({m}, 4096), W (4096, 6144)",
                       _tile_variants(sizes, tiles, n_tile=[48, 128], k_tile=[128]))


def _gated_mlp(workload: str, group: str, b: int, m: int, n: int) -> Row:
    sizes = {"m": m, "k": 4096, "n": n}
    tiles = {"k_tile": 128, "n_tile": 64}
    small = {"m": min(m, 32), "k": 128, "n": 64 if n == 4096 else 112}
    return _matmul_row(workload, group, b, "gated_mlp", sizes, tiles, small,
                       {"k_tile": 32, "n_tile": 16}, f"X ({m}, 4096), W1, W3 (4096, {n})",
                       _tile_variants(sizes, tiles, n_tile=[32, 128], k_tile=[256]))


def _lora(workload: str, group: str, b: int, m: int, k: int) -> Row:
    sizes = {"m": m, "k": k, "n": 4096, "r": 16}
    tiles = {"k_tile": 256, "n_tile": 64 if k == 256 else 32}
    small = {"m": min(m, 64), "k": 64 if k == 256 else 256, "n": 128, "r": 16}
    small_tiles = {"k_tile": 64, "n_tile": 32}
    shapes = f"X ({m}, {k}), W ({k}, 4096), A ({k}, 16), B (16, 4096)"
    choices = {"n_tile": [32, 64]} if k == 256 else {"n_tile": [64], "k_tile": [128, 512]}
    return _matmul_row(workload, group, b, "lora", sizes, tiles, small, small_tiles, shapes,
                       _tile_variants(sizes, tiles, **choices))


def _mlp_adapter(b: int) -> Row:
    sizes = {"m": b, "k": 4096, "r": 16, "n": 4096}
    tiles = {"parts": 32, "k_tile": 128, "n_tile": 64}
    small = {"m": 8 if b == 8 else 64, "k": 256, "r": 16, "n": 64}
    variants = [{"parts": p, "k_tile": 4096 // p, "n_tile": n} for p, n in
                ((64, 128), (16, 64), (32, 128))]
    return _matmul_row("mlp_adapter", "B", b, "mlp_adapter", sizes, tiles, small,
                       {"parts": 4, "k_tile": 32, "n_tile": 16},
                       f"X ({b}, 4096), W1 (4096, 16), W2 (16, 4096)", variants)


def _build_rows() -> list[Row]:
    rows: list[Row] = []
    for b in (1, 8):
        rows.append(_group_a_attention("gqa", "attention", 2, 256, b))
    for b in (1, 8):
        rows.append(_group_a_attention("mha", "attention", 32, 16, b))
    for b in (1, 8):
        rows.append(_group_a_attention("mqa", "attention", 1, 1024, b))
    for b in (1, 8):
        rows.append(_group_a_attention("qknorm_gqa", "qknorm_attention", 2, 256, b))
    rows += [_rmsnorm_linear("rmsnorm_linear", "A", b, 2 * b) for b in (1, 8)]
    rows += [_gated_mlp("gated_mlp", "A", b, 8 * b, 4096) for b in (1, 4)]
    rows += [_lora("lora", "A", b, 16 * b, 256) for b in (1, 4)]
    for b in (1, 8):
        rows.append(_group_b_attention("gqa_llama70b_decode", 16, 2, 1, 128, b))
    for b in (1, 8):
        rows.append(_group_b_attention("gqa_llama70b_spec", 16, 2, 32, 128, b))
    for b in (1, 8):
        rows.append(_group_b_attention("mqa_falcon7b_decode", 71, 1, 1, 64, b))
    rows += [_lora("lora_llama7b", "B", b, b, 4096) for b in (1, 16)]
    rows += [_gated_mlp("gated_mlp_llama3_8b", "B", b, b, 14336) for b in (1, 16)]
    rows += [_rmsnorm_linear("rmsnorm_linear_llama3_8b", "B", b, b) for b in (1, 16)]
    rows += [_mlp_adapter(b) for b in (8, 64)]
    return rows


ROWS: dict[str, Row] = {r.name: r for r in _build_rows()}
WORKLOAD_NAMES: tuple[str, ...] = tuple(dict.fromkeys(r.workload for r in ROWS.values()))


def select(names=(), group: str | None = None) -> list[Row]:
    """Rows named (row names like ``gqa_b1`` or workload names like ``gqa``), in table order,
    all of them when no name is given; only those of ``group`` ("A" or "B") when given."""
    wanted = set(names)
    unknown = wanted - set(ROWS) - set(WORKLOAD_NAMES)
    if unknown:
        raise KeyError(f"unknown rows {sorted(unknown)}; rows are {sorted(ROWS)}")
    out = []
    for row in ROWS.values():
        if wanted and row.name not in wanted and row.workload not in wanted:
            continue
        if group and row.group != group.upper():
            continue
        out.append(row)
    return out
