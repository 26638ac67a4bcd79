"""What the engine needs to know about a Hugging Face model folder, read with `transformers`'
config classes (never its modeling code)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import torch

from engine.model_card import (
    SUPPORTED_ARCHITECTURES,
    UnsupportedModelError,
    load_model_card,
    resolve_dtype_name,
)

__all__ = ["SUPPORTED_ARCHITECTURES", "ModelConfig", "UnsupportedModelError", "load_model_config"]


def resolve_dtype(name: str, config_dtype: str | None) -> torch.dtype:
    """``auto`` takes the checkpoint's dtype (fp32 if unset)."""
    return getattr(torch, resolve_dtype_name(name, config_dtype))  # type: ignore[no-any-return]


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


@dataclass(frozen=True)
class ModelConfig:
    path: str
    architecture: str
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    rms_norm_eps: float
    max_position_embeddings: int
    tie_word_embeddings: bool
    dtype: torch.dtype
    inv_freq: tuple[float, ...] = field(repr=False)
    rope_attention_scaling: float = 1.0
    sliding_windows: tuple[int | None, ...] = ()  # per layer; None = full attention
    eos_token_ids: tuple[int, ...] = ()

    @property
    def dtype_str(self) -> str:
        return dtype_name(self.dtype)


def load_model_config(path: str | Path, dtype: str = "auto") -> ModelConfig:
    """Parse ``config.json`` of a Llama-family folder. Raises UnsupportedModelError otherwise."""
    from transformers import AutoConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    folder = Path(path)
    card = load_model_card(folder)  # checks the folder and the architecture
    arch = card.architecture
    raw = json.loads((folder / "config.json").read_text())
    hf = AutoConfig.from_pretrained(str(folder))
    num_heads = hf.num_attention_heads
    head_dim = getattr(hf, "head_dim", None) or hf.hidden_size // num_heads
    num_kv_heads = getattr(hf, "num_key_value_heads", None) or num_heads
    if num_heads % num_kv_heads:
        raise UnsupportedModelError(
            f"num_attention_heads ({num_heads}) must be a multiple of "
            f"num_key_value_heads ({num_kv_heads})"
        )

    rope_params = getattr(hf, "rope_parameters", None) or {}
    rope_type = rope_params.get("rope_type", "default")
    if rope_type == "default":
        base = rope_params.get("rope_theta", getattr(hf, "rope_theta", 10000.0))
        inv_freq = 1.0 / (base ** (torch.arange(0, head_dim, 2, dtype=torch.float) / head_dim))
        scaling = 1.0
    elif rope_type in ("linear", "llama3", "yarn"):
        inv_freq, scaling = ROPE_INIT_FUNCTIONS[rope_type](hf, torch.device("cpu"))
    else:
        raise UnsupportedModelError(f"unsupported rope_type {rope_type!r}")

    windows = _sliding_windows(hf, raw, arch)
    eos = hf.eos_token_id
    eos_ids = tuple(eos) if isinstance(eos, list) else ((eos,) if eos is not None else ())
    return ModelConfig(
        path=str(folder),
        architecture=arch,
        hidden_size=hf.hidden_size,
        num_layers=hf.num_hidden_layers,
        num_heads=num_heads,
        num_kv_heads=num_kv_heads,
        head_dim=head_dim,
        intermediate_size=hf.intermediate_size,
        vocab_size=hf.vocab_size,
        rms_norm_eps=hf.rms_norm_eps,
        max_position_embeddings=hf.max_position_embeddings,
        tie_word_embeddings=bool(getattr(hf, "tie_word_embeddings", False)),
        dtype=resolve_dtype(dtype, card.config_dtype),
        inv_freq=tuple(float(x) for x in inv_freq),
        rope_attention_scaling=float(scaling),
        sliding_windows=windows,
        eos_token_ids=eos_ids,
    )


def _sliding_windows(hf: object, raw: dict, arch: str) -> tuple[int | None, ...]:
    n = int(getattr(hf, "num_hidden_layers"))  # noqa: B009
    window = getattr(hf, "sliding_window", None)
    layer_types = getattr(hf, "layer_types", None)
    if arch == "MistralForCausalLM":
        return tuple([window] * n)
    if layer_types and window:
        return tuple(window if t == "sliding_attention" else None for t in layer_types)
    return tuple([None] * n)
