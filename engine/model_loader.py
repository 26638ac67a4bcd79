"""Load a Llama-family Hugging Face folder into pdserve's model (safetensors only)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import torch
from safetensors import safe_open

from engine.model_config import ModelConfig
from engine.models.layers import RotaryEmbedding
from engine.models.llama import LlamaForCausalLM

_LAYER = re.compile(r"^model\.layers\.(\d+)\.(.+)$")
_QKV = {"q_proj": 0, "k_proj": 1, "v_proj": 2}
_GATE_UP = {"gate_proj": 0, "up_proj": 1}


def _weight_files(folder: Path) -> list[Path]:
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        names = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        return [folder / n for n in names]
    single = folder / "model.safetensors"
    if single.is_file():
        return [single]
    raise FileNotFoundError(f"no safetensors weights in {str(folder)!r}")


def _tensor_names(files: list[Path]) -> set[str]:
    names: set[str] = set()
    for f in files:
        with safe_open(str(f), framework="pt") as fh:
            names.update(fh.keys())
    return names


def load_model(cfg: ModelConfig, device: torch.device) -> LlamaForCausalLM:
    """Build the model on ``device`` in ``cfg.dtype`` and fill it from the checkpoint.

    Raises ValueError naming any checkpoint tensor that is missing or has the wrong shape.
    """
    folder = Path(cfg.path)
    files = _weight_files(folder)
    names = _tensor_names(files)
    has_bias = "model.layers.0.self_attn.q_proj.bias" in names
    has_qk_norm = "model.layers.0.self_attn.q_norm.weight" in names
    # The rotary tables are computed here, on the device in float32; every other part is
    # built on the meta device and given empty memory in the model's dtype, which the
    # checkpoint fills below. (Built on the meta device, the tables would go through
    # torch._refs, whose first import is ~1 s of an engine's start, only to be thrown away.)
    rotary = RotaryEmbedding(
        cfg.inv_freq, cfg.max_position_embeddings, cfg.rope_attention_scaling
    ).to(device)
    with torch.device("meta"):
        model = LlamaForCausalLM(cfg, rotary, has_qkv_bias=has_bias, has_qk_norm=has_qk_norm)
    for child in model.children():
        if child is not rotary:
            child.to_empty(device=device).to(cfg.dtype)
    on_meta = [n for n, t in (*model.named_parameters(), *model.named_buffers()) if t.is_meta]
    assert not on_meta, f"left on the meta device: {on_meta}"  # a tensor outside the children
    if cfg.tie_word_embeddings:
        model.lm_head.weight = model.embed_tokens.weight

    params = dict(model.named_parameters())
    loaded: set[str] = set()
    q, kv = cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim
    qkv_offsets = [(0, q), (q, kv), (q + kv, kv)]
    inter = cfg.intermediate_size
    for f in files:
        with safe_open(str(f), framework="pt") as fh:
            for name in fh.keys():
                tensor = fh.get_tensor(name)
                target, rows = _map_name(name, qkv_offsets, inter)
                if target is None:
                    continue  # e.g. rotary inv_freq buffers in old checkpoints
                if target == "lm_head.weight" and cfg.tie_word_embeddings:
                    continue
                param = params.get(target)
                if param is None:
                    raise ValueError(f"checkpoint tensor {name!r} has no place in the model")
                dst = param.data if rows is None else param.data[rows[0] : rows[0] + rows[1]]
                if dst.shape != tensor.shape:
                    raise ValueError(
                        f"checkpoint tensor {name!r} has shape {tuple(tensor.shape)}, "
                        f"expected {tuple(dst.shape)}"
                    )
                dst.copy_(tensor.to(dst.dtype))
                loaded.add(name)
    expected = _expected_names(cfg, has_bias, has_qk_norm)
    missing = sorted(expected - loaded)
    if missing:
        raise ValueError(f"checkpoint is missing tensors: {', '.join(missing[:5])}")
    model.eval()
    return model


def _map_name(
    name: str, qkv_offsets: list[tuple[int, int]], inter: int
) -> tuple[str | None, tuple[int, int] | None]:
    if name.startswith("lm_head."):
        return "lm_head.weight", None
    m = _LAYER.match(name)
    if m is None:
        if name in ("model.embed_tokens.weight", "model.norm.weight"):
            return name.removeprefix("model."), None
        return None, None
    i, rest = m.groups()
    prefix = f"layers.{i}."
    parts = rest.split(".")
    if len(parts) == 3 and parts[0] == "self_attn" and parts[1] in _QKV:
        return prefix + f"self_attn.qkv_proj.{parts[2]}", qkv_offsets[_QKV[parts[1]]]
    if len(parts) == 3 and parts[0] == "mlp" and parts[1] in _GATE_UP:
        return prefix + "mlp.gate_up_proj.weight", (_GATE_UP[parts[1]] * inter, inter)
    if rest.endswith("rotary_emb.inv_freq"):
        return None, None
    return prefix + rest, None


def _expected_names(cfg: ModelConfig, has_bias: bool, has_qk_norm: bool) -> set[str]:
    names = {"model.embed_tokens.weight", "model.norm.weight"}
    if not cfg.tie_word_embeddings:
        names.add("lm_head.weight")
    for i in range(cfg.num_layers):
        p = f"model.layers.{i}."
        names.update(
            p + s
            for s in (
                "input_layernorm.weight",
                "post_attention_layernorm.weight",
                "self_attn.q_proj.weight",
                "self_attn.k_proj.weight",
                "self_attn.v_proj.weight",
                "self_attn.o_proj.weight",
                "mlp.gate_proj.weight",
                "mlp.up_proj.weight",
                "mlp.down_proj.weight",
            )
        )
        if has_bias:
            names.update(p + f"self_attn.{x}_proj.bias" for x in "qkv")
        if has_qk_norm:
            names.update(p + f"self_attn.{x}_norm.weight" for x in "qk")
    return names
