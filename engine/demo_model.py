"""Tiny Llama-family model folders with random weights and a locally trained byte-level BPE
tokenizer: the built-in demo model, and the models the tests build. No download, ever.

The folder is a normal Hugging Face folder (config.json, model.safetensors, tokenizer files), so
`transformers` can load it too — that is how the tests check pdserve against HF `generate`.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

# torch and safetensors load only to build a model: finding the cached demo imports neither,
# so a router (no model of its own) can default to the demo without paying for torch.

SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

_WORDS = (
    "the a an of to in and is was for on with as by at from that this it be are or not "
    "model token cache block page prefill decode batch request stream latency throughput "
    "memory compute kernel attention layer head query key value router worker pool queue "
    "serve serving server client prompt output input text word sentence time step budget "
    "first last next long short fast slow small large new old good best more less many "
    "every each some all one two three four five ten hundred thousand million "
    "Paris London Tokyo Berlin river mountain ocean forest city country world people "
    "café naïve résumé über straße 東京 北京 数据 模型 😀 🚀 ✓ π λ Ω"
).split()

SMOLLM2_135M_SHAPE: dict[str, Any] = {
    "hidden_size": 576,
    "num_layers": 30,
    "num_heads": 9,
    "num_kv_heads": 3,
    "intermediate_size": 1536,
    "vocab_size": 49152,
    "tie_word_embeddings": True,
    "rope_theta": 100000.0,
    "max_position_embeddings": 8192,
}

DEMO_SHAPE: dict[str, Any] = {
    "hidden_size": 256,
    "num_layers": 4,
    "num_heads": 4,
    "num_kv_heads": 2,
    "intermediate_size": 768,
    "max_position_embeddings": 4096,
}


def _corpus(num_lines: int = 4000, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    lines = []
    for _ in range(num_lines):
        words = [rng.choice(_WORDS) for _ in range(rng.randint(4, 16))]
        if rng.random() < 0.3:
            words[0] = words[0].capitalize()
        line = " ".join(words) + rng.choice([".", "!", "?", ",", ":", " 42.", " 2026."])
        lines.append(line)
    return lines


def train_tokenizer(folder: str | Path, vocab_size: int = 2048) -> Path:
    """Train a byte-level BPE tokenizer on a fixed synthetic corpus and save it HF-style."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_corpus(), trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=None,
        eos_token="<|endoftext|>",
        pad_token="<|endoftext|>",
        additional_special_tokens=["<|im_start|>", "<|im_end|>"],
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(str(folder))
    return folder


def make_random_model(
    folder: str | Path,
    *,
    architecture: str = "llama",
    hidden_size: int = 64,
    num_layers: int = 2,
    num_heads: int = 4,
    num_kv_heads: int = 2,
    head_dim: int | None = None,
    intermediate_size: int = 128,
    vocab_size: int | None = None,
    max_position_embeddings: int = 2048,
    tie_word_embeddings: bool = True,
    rope_theta: float = 10000.0,
    rope_scaling: dict[str, Any] | None = None,
    sliding_window: int | None = None,
    seed: int = 0,
    tokenizer_folder: str | Path | None = None,
    checkpoint_dtype: str = "float32",
) -> Path:
    """Write a random-weight model folder (safetensors) with a trained tokenizer.

    ``architecture``: ``llama``, ``mistral``, ``qwen2`` (q/k/v bias) or ``qwen3`` (q/k norm).
    ``tokenizer_folder``: copy its tokenizer instead of training one.
    ``checkpoint_dtype``: the stored weights' dtype, ``float32`` or ``bfloat16`` (as most
    published checkpoints are: loaded in float32, every value is then bf16-exact).
    """
    if checkpoint_dtype not in ("float32", "bfloat16"):
        raise ValueError(f"checkpoint_dtype {checkpoint_dtype!r}: float32 or bfloat16")
    from transformers import LlamaConfig, MistralConfig, Qwen2Config, Qwen3Config

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    if tokenizer_folder is None:
        train_tokenizer(folder)
    else:
        for name in os.listdir(tokenizer_folder):
            if name.startswith("tokenizer") or name in (
                "special_tokens_map.json",
                "chat_template.jinja",
            ):
                shutil.copy(Path(tokenizer_folder) / name, folder / name)
    tok_cfg = json.loads((folder / "tokenizer.json").read_text())
    tok_vocab = len(tok_cfg["model"]["vocab"]) + sum(
        1 for t in tok_cfg["added_tokens"] if t["id"] >= len(tok_cfg["model"]["vocab"])
    )
    if vocab_size is None:
        vocab_size = -(-tok_vocab // 64) * 64
    if vocab_size < tok_vocab:
        raise ValueError(f"vocab_size {vocab_size} is smaller than the tokenizer's {tok_vocab}")
    head_dim = head_dim or hidden_size // num_heads
    eos_id = next(t["id"] for t in tok_cfg["added_tokens"] if t["content"] == "<|endoftext|>")

    common: dict[str, Any] = dict(
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        intermediate_size=intermediate_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_kv_heads,
        head_dim=head_dim,
        max_position_embeddings=max_position_embeddings,
        rms_norm_eps=1e-6,
        tie_word_embeddings=tie_word_embeddings,
        eos_token_id=eos_id,
        bos_token_id=None,
        pad_token_id=eos_id,
    )
    rope: dict[str, Any] = {"rope_type": "default", "rope_theta": rope_theta}
    if rope_scaling:
        rope = {**rope_scaling, "rope_theta": rope_theta}
    common["rope_parameters"] = rope
    cls = {
        "llama": LlamaConfig,
        "mistral": MistralConfig,
        "qwen2": Qwen2Config,
        "qwen3": Qwen3Config,
    }[architecture]
    if architecture == "mistral":
        common["sliding_window"] = sliding_window
    elif sliding_window is not None:
        raise ValueError("sliding_window is only supported for mistral here")
    config = cls(**common)
    config.architectures = [cls.__name__.replace("Config", "ForCausalLM")]
    config.dtype = checkpoint_dtype
    config.save_pretrained(str(folder))

    import torch
    from safetensors.torch import save_file

    weights = _random_weights(architecture, common, seed)
    dtype = getattr(torch, checkpoint_dtype)
    save_file(
        {name: w.to(dtype) for name, w in weights.items()},
        str(folder / "model.safetensors"),
        metadata={"format": "pt"},
    )
    return folder


def _random_weights(arch: str, c: dict[str, Any], seed: int) -> dict[str, torch.Tensor]:
    import torch

    g = torch.Generator().manual_seed(seed)
    h, hd = c["hidden_size"], c["head_dim"]
    nq, nkv, inter = c["num_attention_heads"], c["num_key_value_heads"], c["intermediate_size"]

    def lin(out_f: int, in_f: int) -> torch.Tensor:
        # Gain 2: a random model that produces varied text instead of one repeated token.
        return torch.randn(out_f, in_f, generator=g) * (2.0 / in_f**0.5)

    def norm(n: int) -> torch.Tensor:
        return 1.0 + 0.1 * torch.randn(n, generator=g)

    w: dict[str, torch.Tensor] = {
        "model.embed_tokens.weight": 0.3 * torch.randn(c["vocab_size"], h, generator=g)
    }
    for i in range(c["num_hidden_layers"]):
        p = f"model.layers.{i}."
        w[p + "input_layernorm.weight"] = norm(h)
        w[p + "post_attention_layernorm.weight"] = norm(h)
        w[p + "self_attn.q_proj.weight"] = lin(nq * hd, h)
        w[p + "self_attn.k_proj.weight"] = lin(nkv * hd, h)
        w[p + "self_attn.v_proj.weight"] = lin(nkv * hd, h)
        w[p + "self_attn.o_proj.weight"] = lin(h, nq * hd)
        if arch == "qwen2":
            w[p + "self_attn.q_proj.bias"] = 0.1 * torch.randn(nq * hd, generator=g)
            w[p + "self_attn.k_proj.bias"] = 0.1 * torch.randn(nkv * hd, generator=g)
            w[p + "self_attn.v_proj.bias"] = 0.1 * torch.randn(nkv * hd, generator=g)
        if arch == "qwen3":
            w[p + "self_attn.q_norm.weight"] = norm(hd)
            w[p + "self_attn.k_norm.weight"] = norm(hd)
        w[p + "mlp.gate_proj.weight"] = lin(inter, h)
        w[p + "mlp.up_proj.weight"] = lin(inter, h)
        w[p + "mlp.down_proj.weight"] = lin(h, inter)
    w["model.norm.weight"] = norm(h)
    if not c["tie_word_embeddings"]:
        w["lm_head.weight"] = lin(c["vocab_size"], h)
    return {k: v.contiguous() for k, v in w.items()}


def default_cache_dir() -> Path:
    return Path(os.environ.get("PDSERVE_CACHE", Path.home() / ".cache" / "pdserve"))


def demo_model_path() -> Path:
    """The built-in demo model, created on first use (atomically) and cached."""
    target = default_cache_dir() / "demo-llama-v1"
    if (target / "model.safetensors").is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=target.parent, prefix=".demo-"))
    make_random_model(tmp, **DEMO_SHAPE, seed=1234)
    try:
        tmp.rename(target)
    except OSError:  # another process won the race
        shutil.rmtree(tmp, ignore_errors=True)
    return target
