"""Model shapes for the GPU throughput benchmarks, and the FLOP / byte counts derived from them.

The Qwen2.5 shapes use the published ``config.json`` values of Qwen/Qwen2.5-{0.5B,1.5B,3B}
(layers, hidden size, attention heads, KV heads, intermediate size, vocab 151,936, tied
embeddings). Models are built from these configs with **random initialisation** (no weights are
downloaded): throughput does not depend on the weight values, and every report says so.
``tiny`` is a CPU smoke-test shape (not a real model).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class Shape:
    """Architecture numbers of a Qwen2-family decoder."""

    num_layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    intermediate_size: int
    vocab_size: int = 151_936
    tie_word_embeddings: bool = True
    max_position_embeddings: int = 32_768
    rope_theta: float = 1_000_000.0

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    def as_dict(self) -> dict:
        return asdict(self)


SHAPES: dict[str, Shape] = {
    # https://huggingface.co/Qwen/Qwen2.5-0.5B/blob/main/config.json
    "qwen2.5-0.5b": Shape(num_layers=24, hidden_size=896, num_heads=14, num_kv_heads=2, intermediate_size=4864),
    # https://huggingface.co/Qwen/Qwen2.5-1.5B/blob/main/config.json
    "qwen2.5-1.5b": Shape(num_layers=28, hidden_size=1536, num_heads=12, num_kv_heads=2, intermediate_size=8960),
    # https://huggingface.co/Qwen/Qwen2.5-3B/blob/main/config.json
    "qwen2.5-3b": Shape(num_layers=36, hidden_size=2048, num_heads=16, num_kv_heads=2, intermediate_size=11008),
    "tiny": Shape(num_layers=2, hidden_size=128, num_heads=4, num_kv_heads=2, intermediate_size=256,
                  vocab_size=2048, max_position_embeddings=4096),
}


def get_shape(name: str) -> Shape:
    """The :class:`Shape` called ``name``.

    Raises:
        ValueError: unknown name (the message lists the known ones).
    """
    if name not in SHAPES:
        raise ValueError(f"unknown shape {name!r}; known shapes: {sorted(SHAPES)}")
    return SHAPES[name]


def qwen2_config(shape: Shape, attn_implementation: str = "sdpa"):
    """A ``transformers.Qwen2Config`` for ``shape`` (no cache of weights needed)."""
    from transformers import Qwen2Config

    special = 151643 if shape.vocab_size > 151643 else shape.vocab_size - 1  # Qwen's <|endoftext|>
    config = Qwen2Config(
        vocab_size=shape.vocab_size, hidden_size=shape.hidden_size, num_hidden_layers=shape.num_layers,
        num_attention_heads=shape.num_heads, num_key_value_heads=shape.num_kv_heads,
        intermediate_size=shape.intermediate_size, tie_word_embeddings=shape.tie_word_embeddings,
        max_position_embeddings=shape.max_position_embeddings, rope_theta=shape.rope_theta,
        rms_norm_eps=1e-6, hidden_act="silu", bos_token_id=special, eos_token_id=special,
        pad_token_id=special, use_cache=True)
    config._attn_implementation = attn_implementation
    return config


def build_random_model(shape: Shape, dtype, device, attn_implementation: str = "sdpa", seed: int = 0):
    """A randomly initialised ``Qwen2ForCausalLM`` of ``shape`` built directly on ``device``."""
    import torch
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(qwen2_config(shape, attn_implementation), dtype=dtype)
    return model


def total_params(shape: Shape) -> int:
    """Parameter count of the Qwen2 model (q/k/v biases included, tied head counted once)."""
    d, kv = shape.hidden_size, shape.num_kv_heads * shape.head_dim
    attn = d * d + d + 2 * (d * kv + kv) + d * d          # q (+bias), k/v (+bias), o
    mlp = 3 * d * shape.intermediate_size
    per_layer = attn + mlp + 2 * d                         # two RMSNorm weights
    embed = shape.vocab_size * d
    head = 0 if shape.tie_word_embeddings else shape.vocab_size * d
    return shape.num_layers * per_layer + embed + head + d


def matmul_params(shape: Shape) -> int:
    """Parameters that take part in matrix multiplies per token (and are read per decode step).

    All decoder weights plus the LM head; the input embedding is a row lookup, so an *untied*
    embedding table is excluded. With tied embeddings the shared matrix is the LM head and counts.
    """
    untied_embed = 0 if shape.tie_word_embeddings else shape.vocab_size * shape.hidden_size
    return total_params(shape) - untied_embed


def kv_bytes_per_token(shape: Shape, bytes_per_elem: int = 2) -> int:
    """KV-cache bytes of one token over all layers: ``2 (K,V) * L * kv_heads * head_dim * bytes``."""
    return 2 * shape.num_layers * shape.num_kv_heads * shape.head_dim * bytes_per_elem


def decode_bound_tokens_per_s(shape: Shape, batch: int, mean_context: float, hbm_bytes_per_s: float = 4.8e12,
                              bytes_per_elem: int = 2) -> dict:
    """Memory-bandwidth bound of batched decoding.

    One decode step reads every matmul weight once and the KV cache of every row at its current
    context: ``bytes = matmul_params * bytes_per_elem + batch * mean_context * kv_bytes_per_token``.
    At ``hbm_bytes_per_s`` (H200: 4.8e12 B/s) a step takes at least ``bytes / hbm_bytes_per_s`` and
    yields ``batch`` tokens. Activations, logits and sampling traffic are ignored (the bound is loose).
    """
    weight_bytes = matmul_params(shape) * bytes_per_elem
    kv_bytes = batch * mean_context * kv_bytes_per_token(shape, bytes_per_elem)
    step_s = (weight_bytes + kv_bytes) / hbm_bytes_per_s
    return {"weight_bytes": weight_bytes, "kv_bytes_per_step": kv_bytes, "min_step_s": step_s,
            "bound_tokens_per_s": batch / step_s, "hbm_bytes_per_s": hbm_bytes_per_s}


def train_flops(shape: Shape, seq_lens: list[int]) -> dict:
    """Useful training FLOPs (forward + backward) of a batch of sequences with the given lengths.

    ``6 * matmul_params * tokens`` (Kaplan et al. 2020 / PaLM appendix B) plus causal attention:
    per sequence of length ``s``, ``QK^T`` and ``AV`` cost ``2 * 2 * s^2/2 * H*head_dim`` FLOPs per
    layer forward (causal: half the score matrix), times 3 for forward + backward, i.e.
    ``6 * L * d_attn * s^2`` per sequence = ``12 * L * d_attn * s / 2`` per token (PaLM's
    ``12 * L * H * Q * T`` per token, halved for causality). Padding and gradient-checkpointing
    recomputation are not counted (they are not useful work).
    """
    tokens = int(sum(seq_lens))
    d_attn = shape.num_heads * shape.head_dim
    dense = 6 * matmul_params(shape) * tokens
    attention = sum(6 * shape.num_layers * d_attn * s * s for s in seq_lens)
    return {"tokens": tokens, "dense_flops": float(dense), "attention_flops": float(attention),
            "total_flops": float(dense + attention)}
