"""``PersistentKernel``: a model's decode step built layer by layer as one μGraph.

In the style of the persistent-kernel interface of seed 003: attach inputs and weights (PyTorch
tensors), make placeholders for intermediates, then call layer methods in order — embedding,
RMSNorm + linear, attention over a KV cache, linear + residual, the SiLU-gated MLP, the LM head,
argmax (and, under tensor parallelism, all-reduce). Each layer method adds custom kernels whose
block graphs come from :mod:`mugraph.persistent.layers` to one :class:`KernelGraph`
(``self.graph``), so the whole step is a μGraph that mugraph can print, draw, verify and
compile. ``task_graph()`` turns it into the task graph, ``compile()`` into the persistent
Triton kernel (:mod:`mugraph.persistent.runtime`).

Layers take and return :class:`PTensor` handles. ``output=`` may name a placeholder made with
``new_tensor``; a placeholder is written by exactly one layer, before any layer reads it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any

from mugraph.dtypes import DType, as_dtype
from mugraph.errors import (
    DTypeError,
    GraphStructureError,
    MugraphError,
    ShapeError,
    UnsupportedError,
)
from mugraph.gpu import DEFAULT_GPU, GPUSpec
from mugraph.ir.builder import KernelGraph
from mugraph.ir.tensor import DTensor, contiguous_strides
from mugraph.persistent import layers as L
from mugraph.persistent.tensors import (
    DYNAMIC_INDICES,
    Attached,
    Binding,
    MetaSlot,
    PTensor,
    Row,
    Scratch,
)


@dataclass(frozen=True)
class TilePolicy:
    """How layers split their work into blocks.

    weight_tile_bytes: most bytes of weight rows one projection block holds (all of K: a
        block's weights are loaded at once, before it waits for its input). 32 KB since the
        thirtieth session, with the runtime's L2 prefetches off (``PersistentProgram``'s
        ``prefetch``): on the H100 (``bench_persistent.py --variants default s29_default
        tile16k``, benchmarks/persistent_gpu_s30/call6) the decode step of Llama-3.2-1B ran
        in 1018.5 µs against 1058.1 with 16 KB tiles and 1091.2 with 16 KB tiles and the
        prefetches; Qwen3-0.6B's in 771.8 against 766.6 and 811.2. From the eighteenth
        session to the twenty-ninth it was 16 KB: with the prefetches, the step of
        Llama-3.2-1B then ran in 1174 µs against 1200 (32 KB), 1378 (8 KB) and 4103 (64 KB,
        spilled registers), Qwen3-0.6B's in 967 against 958, 1083 and 1292 µs;
    min_blocks: the number of blocks a projection aims for (the widest tile that gives at
        least this many is taken: small blocks balance the programs, large ones cost less
        per byte). 64 since the thirty-first session (256 before): Qwen3-0.6B's q / k / v
        projections then make 256 blocks of 32 KB in all, one per program of their level,
        each loaded before its task waits, where 256 blocks each of 8-16 KB made tasks of 2-4
        blocks, whose later blocks loaded after the wait; its o_proj makes 128 blocks of 32 KB
        against 256 of 16 KB, and Llama-3.2-1B's k / v projections 64 blocks of 32 KB each
        against 256 of 8 KB. On the H100 (``bench_persistent.py --variants default
        min_blocks64``, benchmarks/persistent_gpu_s31/call2) the step of Qwen3-0.6B took
        717.8 µs against 742.9, Llama-3.2-1B's 972.0 against 994.3;
    max_tile_n: most output columns per projection block;
    attention_chunk: most cached positions per attention block;
    copy_tile: most elements per block of copies (embedding) and all-reduces;
    argmax_parts: most slices of the logits in the first argmax stage;
    fuse_attention_output: an attention output read only by the next linear + residual
        layer is combined inside that layer's kernel (one dependency level fewer). Off by
        default: on the H100 (2026-11-23, fourth session) the fused form ran the decode step
        slower, Qwen3-0.6B 1516 against 1293 µs and Llama-3.2-1B 1870 against 1577 µs
        (``bench_persistent.py --variants default no_fuse``; benchmarks/RESULTS.md).
    fuse_mlp_down: the MLP's down projection is split over the intermediate dim inside the
        gate / up kernel (:func:`~mugraph.persistent.layers.rmsnorm_gate_up_down`, an
        accumulating output; one dependency level fewer per layer): the MLP's result is left
        as two rows, its residual and the float32 sum, which the next layer's projections
        (and the LM head's norm) add as they read them. The down weight is attached
        transposed, a copy. Only on one rank, and only for an MLP whose ``output=`` is not
        given. Off by default: the float32 sums are added in whatever order the blocks
        finish, so a step's logits differ from run to run (on the H100, twenty-fifth session:
        layer 0's sums by at most 1.2e-6 relative, the logits of a 96-step run by 1.4-1.7%
        at the median from the unfused kernel's, as bfloat16 roundings downstream flip). The
        step was faster for Qwen3-0.6B (818 against 855-857 µs) and not for Llama-3.2-1B
        (1085-1090 against 1087-1089 µs): ``bench_persistent.py --variants default fuse_mlp``.
        Sums in int64 fixed point are the same from run to run but were slower than the
        default on the H100 (twenty-seventh session, call 8: 970 against 828 µs for
        Qwen3-0.6B, 1171 against 1094 for Llama-3.2-1B; benchmarks/RESULTS.md).
    fuse_o_proj_heads: the attention's combination and its output projection are one kernel
        (:func:`~mugraph.persistent.layers.attention_combine_projection`, an accumulating
        output over the KV heads: one dependency level fewer per layer), whose result its
        readers add to the residual. The row a layer starts from is then written whole by
        its first projection that reads it (``rmsnorm_linear(..., materialize=True)``), as
        the residual of its output projection; with ``fuse_mlp_down``, a layer is four
        levels. Only on one rank. Off: on the H100 (twenty-fifth session, call 12) the step
        with both took 1559 µs for Qwen3-0.6B and 1438 µs for Llama-3.2-1B, against 815 /
        1088 with ``fuse_mlp_down`` alone. Its trace (call 13) showed 2048 blocks a layer
        (``gemv`` aimed for ``min_blocks`` columns' blocks per KV head), each adding up its
        head's partials: 20 µs of work per task, and the tasks started early, beside the
        attention's. Since then it aims for ``min_blocks`` blocks in all (256 for Qwen3-0.6B,
        ``gemv(groups=)``): 881 / 1159 µs against 830 / 1087 with ``fuse_mlp_down`` alone
        (twenty-sixth session, call 1), still slower: the fused level took 5.8 µs a layer
        against 1.45 for the combination, and o_proj's levels saved about 2.2.
    fused_mlp_weights: how many weights' rows of a fused MLP block ``weight_tile_bytes``
        counts (2: the gate's and the up's, as for the unfused gate / up kernel, the block's
        rows of the transposed down weight coming on top; 3: all three).
    combine_per_query_head: the attention's combination of its partial sums takes one block
        per query head (since the thirty-fifth session); False: one per KV head, its group's
        query heads together (Qwen2.5-0.5B: 2 blocks of 7 heads). On the H100
        (``bench_persistent.py --variants default combine_kv_head``,
        benchmarks/persistent_gpu_s35/call4) the step took 618.9 µs against 623.1
        (Qwen2.5-0.5B) and 715.7 against 718.3 (Qwen3-0.6B): no slower, and the difference is
        within what one variant moves between calls;
    by_role: ``(role, weight_tile_bytes, min_blocks)`` entries that replace the two budgets
        for the projections of one role (:data:`GEMV_ROLES`): a projection alone in its
        level (o_proj) can aim for as many blocks as there are programs while q / k / v share
        theirs, and a gate / up kernel can take one wider block per program instead of
        some programs taking two. None by default: on the H100 (thirty-second session,
        ``bench_persistent.py --variants default role_tiles``,
        benchmarks/persistent_gpu_s32/call1) Qwen3-0.6B's o_proj in 256 blocks of 16 KB and
        gate / up in 256 of 48 KB ran the step in 750.6 µs against 720.2: its gate / up
        tasks passed their wait 3.94 µs after the event fired, their poll behind 48 KB of
        weight loads per program.
    """

    weight_tile_bytes: int = 32 * 1024
    min_blocks: int = 64
    max_tile_n: int = 256
    attention_chunk: int = 64
    copy_tile: int = 1024
    argmax_parts: int = 128
    fuse_attention_output: bool = False
    fuse_mlp_down: bool = False
    fuse_o_proj_heads: bool = False
    fused_mlp_weights: int = 2
    combine_per_query_head: bool = True
    by_role: tuple[tuple[str, int, int], ...] = ()

    def __post_init__(self) -> None:
        for name in ("weight_tile_bytes", "min_blocks", "max_tile_n", "attention_chunk",
                     "copy_tile", "argmax_parts"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise MugraphError(f"TilePolicy.{name} must be a positive int, got {value!r}")
        for name in ("fuse_attention_output", "fuse_mlp_down", "fuse_o_proj_heads",
                     "combine_per_query_head"):
            if not isinstance(value := getattr(self, name), bool):
                raise MugraphError(f"TilePolicy.{name} must be True or False, got {value!r}")
        if self.fused_mlp_weights not in (2, 3):
            raise MugraphError(
                f"TilePolicy.fused_mlp_weights must be 2 or 3, got {self.fused_mlp_weights!r}")
        for entry in self.by_role:
            ok = (
                isinstance(entry, tuple)
                and len(entry) == 3
                and entry[0] in GEMV_ROLES
                and all(isinstance(v, int) and not isinstance(v, bool) and v > 0
                        for v in entry[1:])
            )
            if not ok:
                raise MugraphError(
                    f"TilePolicy.by_role: {entry!r} is not (role, weight_tile_bytes, "
                    f"min_blocks) with a role among {sorted(GEMV_ROLES)} and positive ints"
                )
        roles = [entry[0] for entry in self.by_role]
        if len(set(roles)) != len(roles):
            raise MugraphError(f"TilePolicy.by_role: a role is given twice in {roles}")

    def gemv(
        self,
        n: int,
        k: int,
        itemsize: int,
        weights: int = 1,
        groups: int = 1,
        role: str | None = None,
    ) -> L.GemvTiles:
        """The widest tile of output columns dividing ``n`` whose weight rows fit the budget
        and that gives ``min_blocks`` blocks (or as many as the budget allows); ``groups``:
        another grid axis multiplies the blocks (the KV heads of
        :func:`~mugraph.persistent.layers.attention_combine_projection`); ``role``: the
        projection's role, whose ``by_role`` entry (if any) gives the two budgets."""
        budget, min_blocks = self.weight_tile_bytes, self.min_blocks
        for name, tile_bytes, blocks in self.by_role:
            if name == role:
                budget, min_blocks = tile_bytes, blocks
        fits = max(1, budget // (k * itemsize * weights))
        widest = min(self.max_tile_n, fits, max(1, n * groups // min_blocks))
        return L.GemvTiles(largest_divisor(n, widest))


# what TilePolicy.by_role can name: the projections of each layer method
GEMV_ROLES = frozenset(
    {"rmsnorm_linear", "linear_residual", "gate_up", "down", "lm_head", "combine_proj_heads",
     "gate_up_down"}
)


def largest_divisor(n: int, at_most: int) -> int:
    """The largest divisor of ``n`` that is at most ``at_most`` (at least 1)."""
    for d in range(min(n, max(1, at_most)), 0, -1):
        if n % d == 0:
            return d
    return 1


@dataclass(frozen=True)
class KernelRole:
    """What a custom kernel of the step is for: its layer and its part of the layer."""

    op: int  # position of the customized operator in the kernel graph
    layer: str
    part: str
    argmax: str | None = None  # "partial" / "final": the kernel also tracks the argmax
    companions: tuple[str, ...] = ()  # int32 buffers the argmax stages read and write

    @property
    def label(self) -> str:
        return f"{self.layer}.{self.part}"


@dataclass
class LayerRecord:
    name: str
    kind: str
    kernels: list[int] = field(default_factory=list)


@dataclass(frozen=True)
class PendingAttention:
    """An attention output whose combination is not built yet (``fuse_attention_output``,
    ``fuse_o_proj_heads``): the output projection that reads it combines the partial sums
    itself; any other reader gets :func:`~mugraph.persistent.layers.attention_combine`."""

    record: LayerRecord
    parts: tuple[DTensor, DTensor, DTensor, DTensor]  # o_part, l_part, o_new, l_new
    shape: L.AttentionShape


@dataclass(frozen=True)
class PendingSum:
    """A row left as several, ``base + sum(summed)``: a residual and the float32 outputs that
    kernels accumulate over blocks (``TilePolicy.fuse_mlp_down``, ``fuse_o_proj_heads``).
    Readers that add the rows as they read them take them all; any other reads
    ``materialized`` (the row written whole by the first projection that reads it, under
    ``fuse_o_proj_heads``) or gets them added by a kernel of its own first."""

    record: LayerRecord
    base: DTensor
    summed: tuple[DTensor, ...]
    materialized: DTensor | None = None


@dataclass(frozen=True)
class RopeTables:
    """The cos / sin tables of every position (max_seq, head_dim), as attached tensors."""

    cos: PTensor
    sin: PTensor


class PersistentKernel:
    """A decode step (one token) built layer by layer; see the module docstring."""

    def __init__(
        self,
        *,
        max_seq_len: int,
        dtype: DType | str | None = None,
        tiles: TilePolicy | None = None,
        world_size: int = 1,
        rank: int = 0,
        gpu: GPUSpec = DEFAULT_GPU,
    ) -> None:
        if not isinstance(max_seq_len, int) or max_seq_len < 1:
            raise ShapeError(
                f"PersistentKernel: max_seq_len must be a positive int, got {max_seq_len!r}"
            )
        check_world(world_size, rank)
        self.max_seq_len = max_seq_len
        self.dtype = as_dtype(dtype) if dtype is not None else None
        if tiles is not None and not isinstance(tiles, TilePolicy):
            raise GraphStructureError(
                f"PersistentKernel: tiles must be a TilePolicy, got {type(tiles).__name__}")
        self.tiles = tiles or TilePolicy()
        self.world_size = world_size
        self.rank = rank
        self.graph = KernelGraph(gpu)
        self.tensors: dict[str, PTensor] = {}
        self.roles: dict[int, KernelRole] = {}
        self.layers: list[LayerRecord] = []
        self.companions: dict[str, int] = {}  # int32 buffers: name -> length
        self.device: Any = None
        self._by_ref: dict[tuple[int, int], PTensor] = {}
        self._rows: dict[tuple[str, MetaSlot], PTensor] = {}
        self._constants: dict[str, PTensor] = {}
        self._names = 0
        self.token_output: str | None = None

    # ---- tensors --------------------------------------------------------------------------

    def _fresh(self, base: str) -> str:
        name, k = base, 0
        while name in self.tensors:
            k += 1
            name = f"{base}_{k}"
        return name

    def _register(self, t: PTensor) -> PTensor:
        _check_name("PersistentKernel: a tensor", t.name)
        if t.name in self.tensors:
            raise GraphStructureError(f"PersistentKernel: a tensor named {t.name!r} exists already")
        self.tensors[t.name] = t
        if t.dtensor is not None:
            self._by_ref[(t.dtensor.ref.op, t.dtensor.ref.index)] = t
        return t

    def _adopt_device(self, tensor: Any, what: str) -> None:
        if self.device is None:
            self.device = tensor.device
        elif tensor.device != self.device:
            raise GraphStructureError(
                f"{what}: tensor on {tensor.device}, but the kernel's tensors are on {self.device}"
            )

    def _adopt_dtype(self, dtype: DType, what: str) -> None:
        if self.dtype is None:
            self.dtype = dtype
        elif dtype is not self.dtype and what:
            raise DTypeError(
                f"{what}: tensor of dtype {dtype.value}, but the kernel computes in "
                f"{self.dtype.value}"
            )

    def attach_input(
        self, tensor: Any, name: str | None = None, *, dims=None, strides=None, offset: int = 0
    ) -> PTensor:
        """Attach a PyTorch tensor (a weight, a table, a cache). 1-D tensors become (1, n) rows;
        ``dims`` / ``strides`` / ``offset`` view it differently (in elements)."""
        what = f"attach_input({name or ''})"
        tensor = _torch_tensor(tensor, what)
        self._adopt_device(tensor, what)
        dtype = as_dtype(tensor.dtype)
        self._adopt_dtype(dtype, what)
        if dims is None:
            dims = tuple(tensor.shape) if tensor.dim() != 1 else (1, tensor.shape[0])
            strides = strides or (
                tuple(tensor.stride()) if tensor.dim() != 1 else (tensor.shape[0], 1)
            )
        dims = tuple(int(d) for d in dims)
        strides = (
            tuple(int(s) for s in strides) if strides is not None else contiguous_strides(dims)
        )
        span = offset + sum((d - 1) * s for d, s in zip(dims, strides, strict=True)) + 1
        if span > tensor.numel() or not tensor.is_contiguous():
            raise ShapeError(
                f"{what}: a view of dims {list(dims)}, strides {list(strides)} from offset "
                f"{offset} does not fit a contiguous tensor of {tensor.numel()} elements"
            )
        dt = self.graph.new_input(dims, strides, dtype)
        name = name or self._fresh(f"input{len(self.graph.input_ops) - 1}")
        return self._register(PTensor(name, dims, dtype, Attached(tensor, offset), dt))

    def attach_row(self, table: PTensor, index: str, name: str | None = None) -> PTensor:
        """Row ``index`` ("pos" or "token": a scalar of the meta buffer) of an attached 2-D
        table, chosen at run time: a (1, row) tensor."""
        t = self._check_handle("attach_row", "table", table)
        if not isinstance(t.binding, Attached) or len(t.dims) != 2 or t.binding.offset:
            raise GraphStructureError(
                f"attach_row: the table {t.name!r} must be an attached 2-D tensor"
            )
        if index not in DYNAMIC_INDICES:
            raise GraphStructureError(
                f"attach_row: index must be one of {sorted(DYNAMIC_INDICES)}, got {index!r}"
            )
        slot = DYNAMIC_INDICES[index]
        key = (t.name, slot)
        if key in self._rows and name is None:
            return self._rows[key]
        dims = (1, t.dims[1])
        dt = self.graph.new_input(dims, (t.dims[1], 1), t.dtype)
        row = PTensor(
            name or self._fresh(f"{t.name}[{index}]"),
            dims,
            t.dtype,
            Row(t.binding.tensor, slot),
            dt,
        )
        self._rows[key] = self._register(row)
        return row

    def new_tensor(
        self, dims, dtype: DType | str | None = None, name: str | None = None
    ) -> PTensor:
        """A placeholder for an intermediate that a later layer writes (``output=``)."""
        dims = tuple(dims)
        if not dims or any(not isinstance(d, int) or d < 1 for d in dims):
            raise ShapeError(f"new_tensor: dims must be positive ints, got {dims!r}")
        dtype = as_dtype(dtype) if dtype is not None else self._dtype("new_tensor")
        return self._register(PTensor(name or self._fresh("tensor"), dims, dtype, Scratch()))

    def tensor(self, name: str) -> PTensor:
        if name not in self.tensors:
            raise GraphStructureError(f"no tensor named {name!r} in this persistent kernel")
        return self.tensors[name]

    def binding(self, dtensor_ref) -> Binding:
        """Where the kernel-graph tensor at ``dtensor_ref`` lives (Scratch when unnamed)."""
        t = self._by_ref.get((dtensor_ref.op, dtensor_ref.index))
        return t.binding if t is not None else Scratch()

    def handle(self, dtensor_ref) -> PTensor | None:
        return self._by_ref.get((dtensor_ref.op, dtensor_ref.index))

    def _dtype(self, what: str) -> DType:
        if self.dtype is None:
            raise DTypeError(f"{what}: attach a tensor (or pass dtype=) first: no dtype known")
        return self.dtype

    def _constant(self, key: str, make) -> PTensor:
        """A small constant tensor made on the kernel's device (eps, rotate_half, the mask)."""
        if key not in self._constants:
            import torch

            if self.device is None:
                raise GraphStructureError(f"{key}: attach a tensor first: no device known")
            value = torch.as_tensor(make(), dtype=_torch_dtype(self._dtype(key)))
            self._constants[key] = self.attach_input(value.to(self.device).contiguous(), key)
        return self._constants[key]

    def _eps(self, eps: float) -> DTensor:
        if isinstance(eps, bool) or not isinstance(eps, int | float) or not (
            math.isfinite(eps) and eps >= 0
        ):  # a negative eps takes the root of a negative mean square: NaN
            raise UnsupportedError(f"RMSNorm eps must be a finite number >= 0, got {eps!r}")
        return self._constant(f"eps={eps!r}", lambda: [[float(eps)]]).dtensor

    def _rot(self, rows: int) -> DTensor:
        return self._constant(
            f"rotate_half_pairs{rows}", lambda: L.rotate_half_pairs(rows)
        ).dtensor

    def _mask_row(self) -> DTensor:
        import numpy as np

        n = self.max_seq_len

        def make():
            rows = np.arange(n)[:, None]
            return np.where(np.arange(n)[None, :] < rows, 0.0, -np.inf).astype(np.float32)

        table = self._constant(f"position_mask{n}", make)
        return self.attach_row(table, "pos").dtensor

    # ---- layer plumbing -------------------------------------------------------------------

    def _check_handle(self, layer: str, arg: str, t: object) -> PTensor:
        if not isinstance(t, PTensor):
            raise GraphStructureError(
                f"{layer}: {arg} must be a tensor of this persistent kernel (attach_input / "
                f"new_tensor / a layer's result), got {type(t).__name__}"
            )
        if self.tensors.get(t.name) is not t:
            raise GraphStructureError(f"{layer}: {arg} {t.name!r} belongs to another kernel")
        return t

    def _read(self, layer: str, arg: str, t: object) -> DTensor:
        """The DTensor of a layer input, which must be written already."""
        p = self._check_handle(layer, arg, t)
        if p.pending is not None:
            self._materialize(p)
        if p.dtensor is None:
            raise GraphStructureError(
                f"{layer}: {arg} {p.name!r} is read before any layer writes it"
            )
        if p.dtype is not self.dtype:
            raise DTypeError(
                f"{layer}: {arg} {p.name!r} is {p.dtype.value}, but the kernel computes in "
                f"{self._dtype(layer).value}"
            )
        return p.dtensor

    def _read_row(self, layer: str, arg: str, t: object) -> tuple[DTensor, tuple[DTensor, ...]]:
        """A row input as ``(base, summed)``: a pending sum's rows, unadded, or the row and
        no summed rows."""
        p = self._check_handle(layer, arg, t)
        if isinstance(p.pending, PendingSum):
            return p.pending.base, p.pending.summed
        return self._read(layer, arg, t), ()

    def _read_whole(self, layer: str, arg: str, t: object) -> DTensor:
        """A row input as one row: a pending sum's materialized row when a projection wrote
        it, else the row (a pending sum is added by a kernel of its own)."""
        p = self._check_handle(layer, arg, t)
        if isinstance(p.pending, PendingSum) and p.pending.materialized is not None:
            return p.pending.materialized
        return self._read(layer, arg, t)

    def _write(
        self,
        layer: str,
        result: DTensor,
        output: PTensor | None,
        base: str,
        binding: Binding | None = None,
    ) -> PTensor:
        """Bind a layer's result to ``output`` (a placeholder) or to a fresh named tensor."""
        if output is None:
            t = PTensor(
                self._fresh(base), result.dims, result.dtype, binding or Scratch(), result, layer
            )
            return self._register(t)
        p = self._check_handle(layer, "output", output)
        if p.dtensor is not None:
            writer = f" (by {p.writer})" if p.writer else ""
            raise GraphStructureError(f"{layer}: output {p.name!r} is written already{writer}")
        if tuple(p.dims) != tuple(result.dims) or p.dtype is not result.dtype:
            raise ShapeError(
                f"{layer}: output {p.name!r} is {list(p.dims)} {p.dtype.value}, but the layer "
                f"produces {list(result.dims)} {result.dtype.value}"
            )
        p.dtensor, p.writer = result, layer
        self._by_ref[(result.ref.op, result.ref.index)] = p
        return p

    def _layer(self, kind: str, name: str | None) -> LayerRecord:
        if name is not None:
            _check_name(f"{kind}: a layer", name)
        record = LayerRecord(name or f"{kind}{len(self.layers)}", kind)
        if any(r.name == record.name for r in self.layers):
            raise GraphStructureError(f"{kind}: a layer named {record.name!r} exists already")
        return record

    def _run(self, record: LayerRecord, build):
        """Run ``build`` (which adds kernels), naming the layer in any error it raises."""
        saved = self._snapshot()
        try:
            result = build()
        except MugraphError as error:
            self._restore(saved)  # a rejected layer leaves the kernel as it was
            raise type(error)(f"layer {record.name!r}: {error}") from None
        self.layers.append(record)
        return result

    def _snapshot(self) -> tuple:
        g = self.graph
        return (
            len(g._ops),
            g._num_inputs,
            len(g._outputs),
            dict(self.tensors),
            dict(self._by_ref),
            dict(self._rows),
            dict(self._constants),
            dict(self.roles),
            dict(self.companions),
            self.token_output,
            {n: (t.dtensor, t.writer, t.pending) for n, t in self.tensors.items()},
        )

    def _restore(self, saved: tuple) -> None:
        g = self.graph
        (
            n_ops,
            n_inputs,
            n_outputs,
            tensors,
            by_ref,
            rows,
            constants,
            roles,
            companions,
            token,
            handles,
        ) = saved
        del g._ops[n_ops:]
        del g._outputs[n_outputs:]
        g._num_inputs = n_inputs
        self.tensors, self._by_ref, self._rows = tensors, by_ref, rows
        self._constants, self.roles, self.companions = constants, roles, companions
        self.token_output = token
        for name, (dtensor, writer, pending) in handles.items():
            t = self.tensors[name]
            t.dtensor, t.writer, t.pending = dtensor, writer, pending

    def _role(self, record: LayerRecord, t: DTensor, part: str, **kw) -> None:
        self.roles[t.ref.op] = KernelRole(t.ref.op, record.name, part, **kw)
        if t.ref.op not in record.kernels:
            record.kernels.append(t.ref.op)

    # ---- layers ---------------------------------------------------------------------------

    def embed_layer(self, weight: PTensor, output: PTensor | None = None, name: str | None = None):
        """The embedding row of the current token (meta TOKEN), copied into a new tensor."""
        record = self._layer("embed", name)

        def build():
            self._read(record.name, "weight", weight)
            row = self.attach_row(weight, "token").dtensor
            tile = largest_divisor(row.dims[1], self.tiles.copy_tile)
            out = L.embedding_copy(self.graph, row, tile)
            self._role(record, out, "copy")
            return self._write(record.name, out, output, f"{record.name}.out")

        return self._run(record, build)

    def rmsnorm_linear_layer(
        self,
        input: PTensor,  # noqa: A002 - the reference interface's name
        weight_norm: PTensor,
        weight_linear: PTensor,
        output: PTensor | None = None,
        *,
        eps: float = 1e-6,
        bias: PTensor | None = None,
        name: str | None = None,
    ) -> PTensor:
        """``rmsnorm(input) * weight_norm @ weight_linear.T + bias`` (weight in (N, K) layout;
        ``bias``: an optional (1, N) row, Qwen2's q / k / v projections)."""
        record = self._layer("rmsnorm_linear", name)

        def build():
            x, summed = self._read_row(record.name, "input", input)
            wn = self._read(record.name, "weight_norm", weight_norm)
            w = self._read(record.name, "weight_linear", weight_linear)
            b = None if bias is None else self._read(record.name, "bias", bias)
            tiles = self.tiles.gemv(
                w.dims[0], w.dims[-1], w.dtype.itemsize, role="rmsnorm_linear"
            )
            p = self._check_handle(record.name, "input", input)
            blocks = tiles.grid(record.name, w.dims[0])[0]
            if (
                summed
                and self.tiles.fuse_o_proj_heads
                and p.pending.materialized is None
                and x.dims[1] % blocks == 0
            ):  # the first projection of the row also writes it whole, for o_proj's residual
                out, row = L.rmsnorm_linear(
                    self.graph, x, wn, self._eps(eps), w, tiles, summed, materialize=True, bias=b
                )
                self._write(record.name, row, None, f"{p.name}.whole")
                p.pending = replace(p.pending, materialized=row)
            else:
                out = L.rmsnorm_linear(self.graph, x, wn, self._eps(eps), w, tiles, summed,
                                       bias=b)
            self._role(record, out, "proj")
            return self._write(record.name, out, output, f"{record.name}.out")

        return self._run(record, build)

    def linear_residual_layer(
        self,
        input: PTensor,  # noqa: A002
        weight: PTensor,
        residual: PTensor,
        output: PTensor | None = None,
        *,
        name: str | None = None,
    ) -> PTensor:
        """``input @ weight.T + residual`` (under tensor parallelism: this rank's share, then an
        all-reduce that adds the residual once)."""
        record = self._layer("linear_residual", name)

        def build():
            attention = self._check_handle(record.name, "input", input).pending
            if not isinstance(attention, PendingAttention):  # a pending sum is read whole
                attention = None
            w = self._read(record.name, "weight", weight)
            if attention and self.tiles.fuse_o_proj_heads and self.world_size == 1:
                return self._combine_projection(record, attention, w, residual)
            r, summed = self._read_row(record.name, "residual", residual)
            tiles = self.tiles.gemv(
                w.dims[0], w.dims[-1], w.dtype.itemsize, role="linear_residual"
            )
            if summed and (attention or self.world_size > 1):
                r, summed = self._read_whole(record.name, "residual", residual), ()
            if attention and self.world_size == 1:
                out = L.attention_output_projection(
                    self.graph, *attention.parts, attention.shape, w, r, tiles
                )
                self._role(record, out, "combine_proj")
                return self._write(record.name, out, output, f"{record.name}.out")
            x = self._read(record.name, "input", input)
            if self.world_size == 1:
                out = L.linear_residual(self.graph, x, w, r, tiles, summed)
                self._role(record, out, "proj")
                return self._write(record.name, out, output, f"{record.name}.out")
            share = L.linear_partial(self.graph, x, w, tiles)
            self._role(record, share, "proj")
            share_t = self._write(record.name, share, None, f"{record.name}.share")
            return self._all_reduce(record, share_t, r, output)

        return self._run(record, build)

    def mlp_layer(
        self,
        input: PTensor,  # noqa: A002
        weight_norm: PTensor,
        weight_gate: PTensor,
        weight_up: PTensor,
        weight_down: PTensor,
        residual: PTensor | None = None,
        output: PTensor | None = None,
        *,
        eps: float = 1e-6,
        name: str | None = None,
    ) -> PTensor:
        """``down(silu(gate(xn)) * up(xn)) + residual`` with ``xn = rmsnorm(input) * weight_norm``
        (the residual defaults to ``input``): two kernels."""
        record = self._layer("mlp", name)

        def build():
            wn = self._read(record.name, "weight_norm", weight_norm)
            wg = self._read(record.name, "weight_gate", weight_gate)
            wu = self._read(record.name, "weight_up", weight_up)
            wd = self._read(record.name, "weight_down", weight_down)
            resid = residual if residual is not None else input
            if self.tiles.fuse_mlp_down and self.world_size == 1 and output is None:
                x = self._read_row(record.name, "input", input)
                r = self._read_row(record.name, "residual", resid)
                return self._fused_mlp(record, x, wn, wg, wu, weight_down, r, eps)
            x = self._read(record.name, "input", input)
            r = self._read(record.name, "residual", resid)
            size = wg.dtype.itemsize
            h = L.rmsnorm_gate_up(
                self.graph,
                x,
                wn,
                self._eps(eps),
                wg,
                wu,
                self.tiles.gemv(wg.dims[0], wg.dims[1], size, weights=2, role="gate_up"),
            )
            self._role(record, h, "gate_up")
            self._write(record.name, h, None, f"{record.name}.hidden")
            tiles = self.tiles.gemv(wd.dims[0], wd.dims[1], size, role="down")
            if self.world_size == 1:
                out = L.linear_residual(self.graph, h, wd, r, tiles)
                self._role(record, out, "down")
                return self._write(record.name, out, output, f"{record.name}.out")
            share = L.linear_partial(self.graph, h, wd, tiles)
            self._role(record, share, "down")
            share_t = self._write(record.name, share, None, f"{record.name}.share")
            return self._all_reduce(record, share_t, r, output)

        return self._run(record, build)

    def _combine_projection(
        self, record, attention: PendingAttention, w: DTensor, residual
    ) -> PTensor:
        """The attention's combination and output projection as one kernel summed over the KV
        heads (``TilePolicy.fuse_o_proj_heads``): a pending sum of the residual (written whole)
        and the kernel's output."""
        parts, shape = attention.parts, attention.shape
        r = self._read_whole(record.name, "residual", residual)
        size = w.dtype.itemsize
        width = shape.group * shape.head_dim
        tiles = self.tiles.gemv(
            w.dims[0], width, size, groups=shape.num_kv_heads, role="combine_proj_heads"
        )
        out = L.attention_combine_projection(self.graph, parts, shape, w, tiles)
        self._role(record, out, "combine_proj_heads")
        self._write(record.name, out, None, f"{record.name}.proj_sum")
        name = self._fresh(f"{record.name}.out")
        return self._register(
            PTensor(name, tuple(r.dims), r.dtype, Scratch(), pending=PendingSum(record, r, (out,)))
        )

    def _fused_mlp(self, record, x, wn, wg, wu, weight_down, r, eps) -> PTensor:
        """The MLP as one accumulating kernel (``TilePolicy.fuse_mlp_down``): its result is a
        pending sum of the residual's rows and the kernel's float32 output (``x`` and ``r``:
        (base, summed rows))."""
        down = self._check_handle(record.name, "weight_down", weight_down)
        binding = down.binding
        whole = isinstance(binding, Attached) and not binding.offset
        if not whole or tuple(binding.tensor.shape) != tuple(down.dims):
            raise GraphStructureError(
                f"{record.name}: weight_down must be a whole attached tensor to be transposed "
                f"(TilePolicy.fuse_mlp_down), got {down.name!r} bound to {binding!r}"
            )
        t = binding.tensor
        wdt = self.attach_input(t.t().contiguous(), self._fresh(f"{down.name}.T")).dtensor
        size = wg.dtype.itemsize
        tiles = self.tiles.gemv(
            wg.dims[0], wg.dims[1], size, self.tiles.fused_mlp_weights, role="gate_up_down"
        )
        summed = L.rmsnorm_gate_up_down(
            self.graph, x[0], wn, self._eps(eps), wg, wu, wdt, tiles, x[1]
        )
        self._role(record, summed, "gate_up_down")
        self._write(record.name, summed, None, f"{record.name}.down_sum")
        name = self._fresh(f"{record.name}.out")
        base, rows = r
        pending = PendingSum(record, base, (*rows, summed))
        return self._register(PTensor(name, tuple(base.dims), base.dtype, Scratch(),
                                      pending=pending))

    def attention_layer(
        self,
        q: PTensor,
        k: PTensor,
        v: PTensor,
        k_cache: PTensor,
        v_cache: PTensor,
        rope: RopeTables,
        output: PTensor | None = None,
        *,
        num_heads: int,
        num_kv_heads: int,
        q_norm: PTensor | None = None,
        k_norm: PTensor | None = None,
        eps: float = 1e-6,
        name: str | None = None,
    ) -> PTensor:
        """Grouped-query attention of the current token over the KV cache.

        ``q`` (1, heads * head_dim), ``k`` / ``v`` (1, kv_heads * head_dim) are the projections;
        ``k_cache`` / ``v_cache`` attached (max_seq, kv_heads * head_dim) tensors; ``rope`` the
        cos / sin tables (max_seq, head_dim). Per-head RMSNorm of queries and keys when
        ``q_norm`` / ``k_norm`` are given (Qwen3), then RoPE at the current position; the
        current key and value are appended to the caches at that position. Three kernels:
        partial sums over chunks of the cache, the current token's own term (and the cache
        append), and their combination.
        """
        record = self._layer("attention", name)

        def build():
            tq = self._read(record.name, "q", q)
            tk = self._read(record.name, "k", k)
            tv = self._read(record.name, "v", v)
            kc = self._cache(record.name, "k_cache", k_cache)
            vc = self._cache(record.name, "v_cache", v_cache)
            if not isinstance(rope, RopeTables):
                raise GraphStructureError(f"{record.name}: rope must be RopeTables(cos, sin)")
            cos_t = self._read(record.name, "rope.cos", rope.cos)
            self._read(record.name, "rope.sin", rope.sin)
            if not (
                isinstance(num_heads, int)
                and isinstance(num_kv_heads, int)
                and num_heads >= num_kv_heads >= 1
            ):
                raise ShapeError(
                    f"{record.name}: num_heads ({num_heads!r}) and num_kv_heads "
                    f"({num_kv_heads!r}) must be ints with num_heads >= num_kv_heads >= 1"
                )
            head_dim = cos_t.dims[1]
            chunk = largest_divisor(self.max_seq_len, self.tiles.attention_chunk)
            shape = L.AttentionShape(num_heads, num_kv_heads, head_dim, self.max_seq_len, chunk)
            shape.check(record.name)
            width = num_kv_heads * head_dim
            if tuple(kc.dims) != (self.max_seq_len, width) or tuple(vc.dims) != kc.dims:
                raise ShapeError(
                    f"{record.name}: the caches must be ({self.max_seq_len}, {width}), got "
                    f"{list(kc.dims)} and {list(vc.dims)}"
                )
            if (
                tuple(rope.cos.dims) != (self.max_seq_len, head_dim)
                or rope.sin.dims != rope.cos.dims
            ):
                raise ShapeError(
                    f"{record.name}: the rope tables must be ({self.max_seq_len}, {head_dim})"
                )
            heads = L.HeadInputs(
                cos=self.attach_row(rope.cos, "pos").dtensor,
                sin=self.attach_row(rope.sin, "pos").dtensor,
                rot_q=self._rot(shape.group),
                rot_k=self._rot(1),
                eps=self._eps(eps),
                q_norm=self._read(record.name, "q_norm", q_norm) if q_norm is not None else None,
                k_norm=self._read(record.name, "k_norm", k_norm) if k_norm is not None else None,
            )
            k_t = self.attach_input(
                kc.binding.tensor,
                self._fresh(f"{kc.name}.T"),
                dims=(width, self.max_seq_len),
                strides=(1, width),
            ).dtensor
            o_part, l_part = L.attention_partials(
                self.graph, tq, k_t, vc.dtensor, self._mask_row(), heads, shape
            )
            self._role(record, o_part, "partials")
            o_new, l_new, k_row, v_row = L.attention_new_token(self.graph, tq, tk, tv, heads, shape)
            self._role(record, o_new, "new_token")
            for t, base in (
                (o_part, "num"),
                (l_part, "den"),
                (o_new, "new_num"),
                (l_new, "new_den"),
            ):
                self._write(record.name, t, None, f"{record.name}.{base}")
            for row, cache in ((k_row, kc), (v_row, vc)):
                self._write(
                    record.name,
                    row,
                    None,
                    f"{cache.name}[pos]",
                    Row(cache.binding.tensor, MetaSlot.POS),
                )
                self.graph.mark_output(row)
            parts = (o_part, l_part, o_new, l_new)
            defer = self.tiles.fuse_attention_output or self.tiles.fuse_o_proj_heads
            if output is None and defer and self.world_size == 1:
                # deferred: a linear + residual layer reading it fuses the combination
                name = self._fresh(f"{record.name}.out")
                return self._register(
                    PTensor(
                        name,
                        (1, num_heads * head_dim),
                        tq.dtype,
                        Scratch(),
                        pending=PendingAttention(record, parts, shape),
                    )
                )
            out = L.attention_combine(self.graph, *parts, shape,
                                      self.tiles.combine_per_query_head)
            self._role(record, out, "combine")
            return self._write(record.name, out, output, f"{record.name}.out")

        return self._run(record, build)

    def _materialize(self, p: PTensor) -> None:
        """Build the kernel a deferred tensor still needs: an attention output's combination,
        or the sum of a pending row's rows (none when a projection wrote it whole)."""
        pending, p.pending = p.pending, None
        if isinstance(pending, PendingSum) and pending.materialized is not None:
            p.dtensor, p.writer = pending.materialized, pending.record.name
            return
        if isinstance(pending, PendingSum):
            hidden = pending.base.dims[1]
            tile = largest_divisor(hidden, self.tiles.copy_tile)
            out = L.residual_sum(self.graph, pending.base, pending.summed, tile)
            self._role(pending.record, out, "sum")
            p.dtensor, p.writer = out, pending.record.name
            self._by_ref[(out.ref.op, out.ref.index)] = p
            return
        out = L.attention_combine(self.graph, *pending.parts, pending.shape,
                                  self.tiles.combine_per_query_head)
        self._role(pending.record, out, "combine")
        p.dtensor, p.writer = out, pending.record.name
        self._by_ref[(out.ref.op, out.ref.index)] = p

    def _cache(self, layer: str, arg: str, t: object) -> PTensor:
        p = self._check_handle(layer, arg, t)
        self._read(layer, arg, p)
        if not isinstance(p.binding, Attached) or p.binding.offset:
            raise GraphStructureError(f"{layer}: {arg} must be an attached (max_seq, width) tensor")
        return p

    def lm_head_layer(
        self,
        input: PTensor,  # noqa: A002
        weight_norm: PTensor,
        weight: PTensor,
        output: PTensor | None = None,
        *,
        eps: float = 1e-6,
        name: str | None = None,
    ) -> PTensor:
        """The final RMSNorm and the LM head: the logits row (1, vocab)."""
        record = self._layer("lm_head", name)

        def build():
            x, summed = self._read_row(record.name, "input", input)
            wn = self._read(record.name, "weight_norm", weight_norm)
            w = self._read(record.name, "weight", weight)
            tiles = self.tiles.gemv(w.dims[0], w.dims[1], w.dtype.itemsize, role="lm_head")
            out = L.rmsnorm_linear(self.graph, x, wn, self._eps(eps), w, tiles, summed)
            self._role(record, out, "proj")
            result = self._write(record.name, out, output, f"{record.name}.logits")
            self.graph.mark_output(out)
            return result

        return self._run(record, build)

    def argmax_layer(self, logits: PTensor, name: str | None = None) -> PTensor:
        """The greedy next token: two max stages that also track the position of the maximum.
        The token goes to the meta buffer (the next step's input) and to the token history;
        the returned tensor holds the largest logit."""
        record = self._layer("argmax", name)

        def build():
            x = self._read(record.name, "logits", logits)
            if self.token_output is not None:
                raise GraphStructureError(
                    f"{record.name}: the kernel has an argmax layer already ({self.token_output})"
                )
            parts = largest_divisor(x.dims[1], self.tiles.argmax_parts)
            index_name = f"{record.name}.partial_index"
            partial = L.argmax_partials(self.graph, x, parts)
            self._role(record, partial, "partial", argmax="partial", companions=(index_name,))
            self._write(record.name, partial, None, f"{record.name}.partial_max")
            final = L.argmax_final(self.graph, partial)
            self._role(record, final, "final", argmax="final", companions=(index_name,))
            self.companions[index_name] = parts
            self.graph.mark_output(final)
            self.token_output = record.name
            return self._write(record.name, final, None, f"{record.name}.max_logit")

        return self._run(record, build)

    def allreduce_layer(
        self,
        input: PTensor,  # noqa: A002
        residual: PTensor | None = None,
        output: PTensor | None = None,
        *,
        name: str | None = None,
    ) -> PTensor:
        """The sum of ``input`` over all ranks (plus ``residual``), tile by tile."""
        record = self._layer("allreduce", name)

        def build():
            self._read(record.name, "input", input)
            r = self._read(record.name, "residual", residual) if residual is not None else None
            return self._all_reduce(record, input, r, output)

        return self._run(record, build)

    def _all_reduce(
        self, record: LayerRecord, share: PTensor, residual: DTensor | None, output: PTensor | None
    ) -> PTensor:
        from mugraph.persistent.parallel import Peer

        shares = []
        for r in range(self.world_size):
            if r == self.rank:
                shares.append(share.dtensor)
                continue
            dt = self.graph.new_input(share.dims, contiguous_strides(share.dims), share.dtype)
            peer = PTensor(
                self._fresh(f"{share.name}@rank{r}"),
                share.dims,
                share.dtype,
                Peer(r, share.name),
                dt,
            )
            shares.append(self._register(peer).dtensor)
        tile = largest_divisor(share.dims[1], self.tiles.copy_tile)
        out = L.all_reduce_sum(self.graph, shares, residual, tile)
        self._role(record, out, "allreduce")
        return self._write(record.name, out, output, f"{record.name}.out")

    # ---- results --------------------------------------------------------------------------

    def check(self) -> None:
        """The step must end in an argmax (the next token) and write every placeholder."""
        if self.token_output is None:
            raise GraphStructureError("persistent kernel has no argmax layer: no next token")
        unwritten = [
            t.name for t in self.tensors.values() if t.dtensor is None and t.pending is None
        ]
        if unwritten:
            raise GraphStructureError(f"placeholders never written by a layer: {unwritten}")
        self.graph.check()

    def task_graph(self, num_programs: int, **options):
        """The task graph of the step for ``num_programs`` persistent programs."""
        from mugraph.persistent.taskgraph import build_task_graph

        _check_options("PersistentKernel.task_graph", build_task_graph, options,
                       ("kernel", "num_programs"))
        self.check()
        return build_task_graph(self, num_programs, **options)

    def compile(self, **options):
        """The runnable persistent program (see :mod:`mugraph.persistent.runtime`)."""
        from mugraph.persistent.runtime import PersistentProgram

        _check_options("PersistentKernel.compile", PersistentProgram, options, ("kernel",))
        self.check()
        return PersistentProgram(self, **options)

    def __str__(self) -> str:
        lines = [f"PersistentKernel: {len(self.layers)} layers, {len(self.roles)} custom kernels"]
        for record in self.layers:
            parts = ", ".join(f"%{op} {self.roles[op].part}" for op in record.kernels)
            lines.append(f"  {record.name} ({record.kind}): {parts}")
        return "\n".join(lines)


def _check_options(what: str, target: Any, options: dict, taken: tuple[str, ...]) -> None:
    """Refuse keyword options that ``target`` (a function or class) does not take, naming
    the ones it does (a TypeError from deep inside otherwise)."""
    import inspect

    known = set(inspect.signature(target).parameters) - set(taken)
    unknown = sorted(set(options) - known)
    if unknown:
        raise UnsupportedError(f"{what}: unknown option(s) {unknown}; known: {sorted(known)}")


def check_world(world_size: Any, rank: Any) -> None:
    """Tensor parallelism's ranks: ints with 0 <= rank < world_size."""
    ints = all(isinstance(v, int) and not isinstance(v, bool) for v in (world_size, rank))
    if not (ints and world_size >= 1 and 0 <= rank < world_size):
        raise ShapeError(
            f"PersistentKernel: rank {rank!r} is not in a world of size {world_size!r}")


def _check_name(what: str, name: Any) -> None:
    """Names are what errors, renderings and ``tensor(name)`` show: non-empty strings."""
    if not isinstance(name, str) or not name:
        raise GraphStructureError(f"{what}'s name must be a non-empty str, got {name!r}")


def _torch_tensor(value: Any, what: str):
    try:
        import torch
    except ImportError as error:  # pragma: no cover - torch is a dependency
        raise GraphStructureError(f"{what}: PyTorch is needed") from error
    if not isinstance(value, torch.Tensor):
        raise GraphStructureError(f"{what}: expected a torch.Tensor, got {type(value).__name__}")
    if value.dim() not in (1, 2):
        raise ShapeError(
            f"{what}: expected a 1-D or 2-D tensor, got {value.dim()}-D {list(value.shape)}"
        )
    return value


def _torch_dtype(dtype: DType):
    import torch

    return getattr(torch, dtype.torch_name)
