"""Build a persistent decoder from a ``transformers`` Llama / Mistral / Qwen2 / Qwen3 model object.

``build_decoder(model, max_seq_len)`` reads the weights from the module (no copies, except the
shards of a tensor-parallel rank), allocates the KV caches and the RoPE tables (from the model's
own rotary embedding, so scaled RoPE variants such as Llama 3's are exact), and calls the layer
methods of :class:`~mugraph.persistent.kernel.PersistentKernel` once per decoder layer. The
result compiles to a :class:`~mugraph.persistent.runtime.PersistentProgram` whose ``step`` and
``generate`` decode greedily with the caches on the device.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from mugraph.errors import UnsupportedError
from mugraph.persistent.kernel import (
    PersistentKernel,
    PTensor,
    RopeTables,
    TilePolicy,
    check_world,
)
from mugraph.persistent.parallel import shard

SUPPORTED_MODELS = ("llama", "mistral", "qwen2", "qwen3")
SILU_NAMES = ("silu", "swish")  # transformers' names of x * sigmoid(x), the MLP's gate


@dataclass(frozen=True)
class ModelShape:
    """The sizes of a decoder-only model, as its config gives them."""

    model_type: str
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    eps: float
    qk_norm: bool

    @staticmethod
    def of(config: Any) -> ModelShape:
        kind = getattr(config, "model_type", None)
        if kind not in SUPPORTED_MODELS:
            raise UnsupportedError(
                f"build_decoder: model type {kind!r} is not supported (supported: "
                f"{', '.join(SUPPORTED_MODELS)})"
            )
        act = getattr(config, "hidden_act", "silu")
        if act not in SILU_NAMES:
            raise UnsupportedError(
                f"build_decoder: the MLP's activation is {act!r}; the kernel gates with SiLU "
                f"({' / '.join(SILU_NAMES)})"
            )
        heads = config.num_attention_heads
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
        return ModelShape(
            kind,
            config.hidden_size,
            config.num_hidden_layers,
            heads,
            config.num_key_value_heads,
            head_dim,
            config.intermediate_size,
            config.vocab_size,
            float(config.rms_norm_eps),
            kind == "qwen3",
        )


def _check_full_attention(config: Any, max_seq_len: int) -> None:
    """Every layer attends to every cached position: no sliding window narrower than the
    cache. Which layers use ``sliding_window`` is what transformers reads: ``layer_types``
    where the config has them (Qwen's, from ``use_sliding_window``), else every layer
    unless ``use_sliding_window`` is False (Mistral has neither)."""
    window = getattr(config, "sliding_window", None)
    types = set(getattr(config, "layer_types", None) or ())
    if types:
        windowed = types != {"full_attention"}
    else:
        windowed = getattr(config, "use_sliding_window", None) is not False
    if windowed and window is not None and window < max_seq_len:
        raise UnsupportedError(
            f"build_decoder: attention with a sliding window of {window} positions is not "
            f"supported; a cache of max_seq_len={max_seq_len} would attend past it (use "
            f"max_seq_len <= {window})"
        )


# RoPE types whose frequencies transformers recomputes from the sequence's length once it
# passes the pretraining length (the config key holding it): one table cannot follow them there
_LENGTH_DEPENDENT_ROPE = {"dynamic": None, "longrope": "original_max_position_embeddings"}


def _check_fixed_rope(config: Any, max_seq_len: int) -> None:
    """The rotary tables (one row per position, computed once) are what transformers uses at
    every length up to ``max_seq_len``: a RoPE that rescales with the sequence's length
    ("dynamic", "longrope") is refused beyond the length where it starts to."""
    params = getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None)
    kind = (params or {}).get("rope_type", "default")
    if kind not in _LENGTH_DEPENDENT_ROPE:
        return
    key = _LENGTH_DEPENDENT_ROPE[kind]
    limit = params.get(key) if key else config.max_position_embeddings
    if limit is None or max_seq_len > limit:
        raise UnsupportedError(
            f"build_decoder: {kind!r} RoPE changes its frequencies with the sequence's length "
            f"past {limit} positions; a cache of max_seq_len={max_seq_len} would need them "
            f"(use max_seq_len <= {limit})"
        )


_UNSUPPORTED_BIASES = (("self_attn", "o_proj"), ("mlp", "gate_proj"), ("mlp", "up_proj"),
                       ("mlp", "down_proj"))


def _check_biases(layers: Any) -> None:
    """Biases are taken on the q / k / v projections only (Qwen2's); anywhere else they are
    refused rather than left out."""
    for i, layer in enumerate(layers):
        for block, part in _UNSUPPORTED_BIASES:
            if getattr(getattr(layer, block), part).bias is not None:
                raise UnsupportedError(
                    f"build_decoder: layer {i}'s {block}.{part} has a bias (biases are "
                    f"supported on q_proj, k_proj and v_proj only)"
                )


def rope_tables(model: Any, max_seq_len: int) -> tuple[Any, Any]:
    """cos and sin of every position (max_seq_len, head_dim), from the model's rotary module."""
    import torch

    inner = model.model
    param = next(model.parameters())
    x = torch.zeros(1, dtype=param.dtype, device=param.device)
    positions = torch.arange(max_seq_len, device=param.device)[None]
    with torch.no_grad():
        cos, sin = inner.rotary_emb(x, positions)
    return cos[0].to(param.dtype).contiguous(), sin[0].to(param.dtype).contiguous()


@dataclass
class Decoder:
    """A persistent kernel for a model, with the tensors a caller needs."""

    kernel: PersistentKernel
    shape: ModelShape
    logits: PTensor
    k_caches: list[Any] = field(default_factory=list)
    v_caches: list[Any] = field(default_factory=list)

    def compile(self, **options):
        return self.kernel.compile(**options)


class _Weights:
    """Attach each weight once (tied embeddings are one tensor), sharded for a rank."""

    def __init__(self, pk: PersistentKernel, rank: int, world_size: int) -> None:
        self.pk, self.rank, self.world = pk, rank, world_size
        self.seen: dict[int, tuple[Any, PTensor]] = {}

    def __call__(self, tensor: Any, name: str, split: int | None = None) -> PTensor:
        key = id(tensor)  # tied weights are one Parameter object
        if key not in self.seen:
            value = tensor.detach()
            if split is not None and self.world > 1:
                value = shard(value, self.rank, self.world, split, name)
            self.seen[key] = (tensor, self.pk.attach_input(value.contiguous(), name))
        return self.seen[key][1]


def build_decoder(
    model: Any,
    max_seq_len: int,
    *,
    tiles: TilePolicy | None = None,
    world_size: int = 1,
    rank: int = 0,
) -> Decoder:
    """The decode step of ``model`` (a transformers LlamaForCausalLM, MistralForCausalLM,
    Qwen2ForCausalLM or Qwen3ForCausalLM) as a persistent kernel with KV caches of
    ``max_seq_len`` positions."""
    import torch

    if not (isinstance(model, torch.nn.Module) and hasattr(model, "config")):
        raise UnsupportedError(
            f"build_decoder: expected a transformers causal LM module (LlamaForCausalLM, "
            f"MistralForCausalLM, Qwen2ForCausalLM or Qwen3ForCausalLM), got "
            f"{type(model).__name__}")
    shape = ModelShape.of(model.config)
    check_world(world_size, rank)
    if shape.heads % world_size or shape.kv_heads % world_size:
        raise UnsupportedError(
            f"build_decoder: {shape.heads} heads / {shape.kv_heads} KV heads do not split over "
            f"{world_size} ranks"
        )
    inner = model.model
    _check_full_attention(model.config, max_seq_len)
    _check_fixed_rope(model.config, max_seq_len)
    _check_biases(inner.layers)
    param = next(model.parameters())
    pk = PersistentKernel(max_seq_len=max_seq_len, tiles=tiles, world_size=world_size, rank=rank)
    weight = _Weights(pk, rank, world_size)
    cos, sin = rope_tables(model, max_seq_len)
    rope = RopeTables(pk.attach_input(cos, "rope.cos"), pk.attach_input(sin, "rope.sin"))
    heads, kv_heads = shape.heads // world_size, shape.kv_heads // world_size
    width = kv_heads * shape.head_dim
    decoder_k, decoder_v = [], []
    x = pk.embed_layer(weight(inner.embed_tokens.weight, "embed"), name="embed")
    for i, layer in enumerate(inner.layers):
        attn, mlp = layer.self_attn, layer.mlp
        p = f"layer{i}"
        ln1 = weight(layer.input_layernorm.weight, f"{p}.input_norm")
        proj = {}
        for part in ("q", "k", "v"):
            linear = getattr(attn, f"{part}_proj")
            w = weight(linear.weight, f"{p}.{part}_proj", split=0)
            b = None if linear.bias is None else weight(
                linear.bias, f"{p}.{part}_proj.bias", split=0)
            proj[part] = pk.rmsnorm_linear_layer(
                x, ln1, w, eps=shape.eps, bias=b, name=f"{p}.{part}_proj")
        k_cache = torch.zeros(max_seq_len, width, dtype=param.dtype, device=param.device)
        v_cache = torch.zeros_like(k_cache)
        decoder_k.append(k_cache)
        decoder_v.append(v_cache)
        norms = {}
        if shape.qk_norm:
            norms = {
                "q_norm": weight(attn.q_norm.weight, f"{p}.q_norm"),
                "k_norm": weight(attn.k_norm.weight, f"{p}.k_norm"),
            }
        a = pk.attention_layer(
            proj["q"],
            proj["k"],
            proj["v"],
            pk.attach_input(k_cache, f"{p}.k_cache"),
            pk.attach_input(v_cache, f"{p}.v_cache"),
            rope,
            num_heads=heads,
            num_kv_heads=kv_heads,
            eps=shape.eps,
            name=f"{p}.attn",
            **norms,
        )
        wo = weight(attn.o_proj.weight, f"{p}.o_proj", split=1)
        x = pk.linear_residual_layer(a, wo, x, name=f"{p}.o_proj")
        x = pk.mlp_layer(
            x,
            weight(layer.post_attention_layernorm.weight, f"{p}.post_norm"),
            weight(mlp.gate_proj.weight, f"{p}.gate_proj", split=0),
            weight(mlp.up_proj.weight, f"{p}.up_proj", split=0),
            weight(mlp.down_proj.weight, f"{p}.down_proj", split=1),
            eps=shape.eps,
            name=f"{p}.mlp",
        )
    logits = pk.lm_head_layer(
        x,
        weight(inner.norm.weight, "final_norm"),
        weight(model.lm_head.weight, "lm_head"),
        eps=shape.eps,
        name="lm_head",
    )
    pk.argmax_layer(logits, name="argmax")
    return Decoder(pk, shape, logits, decoder_k, decoder_v)
