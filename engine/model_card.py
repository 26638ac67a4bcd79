"""What a process that runs no model (the router) needs to know about a Hugging Face model
folder, read from ``config.json`` alone: no torch, no transformers config classes.

``engine.model_config.load_model_config`` (the engine's full view, with torch) builds on it,
so the two never disagree on the architecture, the vocabulary or the end-of-sequence ids.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

SUPPORTED_ARCHITECTURES = (
    "LlamaForCausalLM",
    "MistralForCausalLM",
    "Qwen2ForCausalLM",
    "Qwen3ForCausalLM",
)
DTYPE_NAMES = {
    "float32": "float32",
    "fp32": "float32",
    "bfloat16": "bfloat16",
    "bf16": "bfloat16",
    "float16": "float16",
    "fp16": "float16",
    "half": "float16",
}


class UnsupportedModelError(ValueError):
    pass


def resolve_dtype_name(name: str, config_dtype: str | None) -> str:
    """The canonical dtype name; ``auto`` takes the checkpoint's (float32 if unset)."""
    if name == "auto":
        name = config_dtype or "float32"
    if name not in DTYPE_NAMES:
        raise ValueError(
            f"dtype must be one of auto, {', '.join(sorted(DTYPE_NAMES))}; got {name!r}"
        )
    return DTYPE_NAMES[name]


@dataclass(frozen=True)
class ModelCard:
    path: str
    architecture: str
    vocab_size: int
    max_position_embeddings: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    eos_token_ids: tuple[int, ...]
    config_dtype: str | None  # the checkpoint's dtype as config.json names it

    def dtype(self, requested: str = "auto") -> str:
        return resolve_dtype_name(requested, self.config_dtype)


def load_model_card(path: str | Path) -> ModelCard:
    """Read ``config.json``; raises FileNotFoundError or UnsupportedModelError."""
    folder = Path(path)
    if not (folder / "config.json").is_file():
        raise FileNotFoundError(f"no config.json in model folder {str(folder)!r}")
    raw = json.loads((folder / "config.json").read_text())
    archs = raw.get("architectures") or []
    arch = next((a for a in archs if a in SUPPORTED_ARCHITECTURES), None)
    if arch is None:
        raise UnsupportedModelError(
            f"unsupported architecture {archs or raw.get('model_type')!r}; "
            f"pdserve supports {', '.join(SUPPORTED_ARCHITECTURES)}"
        )
    num_heads = int(raw["num_attention_heads"])
    eos = raw.get("eos_token_id")
    eos_ids = tuple(eos) if isinstance(eos, list) else ((eos,) if eos is not None else ())
    return ModelCard(
        path=str(folder),
        architecture=arch,
        vocab_size=int(raw["vocab_size"]),
        max_position_embeddings=int(raw.get("max_position_embeddings", 2048)),
        num_layers=int(raw["num_hidden_layers"]),
        num_heads=num_heads,
        num_kv_heads=int(raw.get("num_key_value_heads") or num_heads),
        head_dim=int(raw.get("head_dim") or int(raw["hidden_size"]) // num_heads),
        eos_token_ids=eos_ids,
        config_dtype=raw.get("dtype") or raw.get("torch_dtype"),
    )


def resolve_max_model_len(requested: int | None, max_position_embeddings: int) -> int:
    """The engine's max_model_len: the model's when not given. Raises ValueError for one the
    model cannot take (past its positions it was never trained on: vLLM refuses it too), rather
    than quietly serving a shorter one than asked for."""
    if requested is None:
        return max_position_embeddings
    if requested <= 0:
        raise ValueError(f"max_model_len must be positive, got {requested}")
    if requested > max_position_embeddings:
        raise ValueError(
            f"max_model_len {requested} is longer than the model's max_position_embeddings "
            f"({max_position_embeddings}); give at most that"
        )
    return requested
