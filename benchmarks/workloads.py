"""The offline-throughput workload: the model shape, the model folder, the requests, their FLOPs.

Everything here is deterministic from a seed, so every engine (and every rerun) sees the same
token ids. The model is a random-weight Llama with the SmolLM2-135M shape (or, with
``shape="llama-1b"``, the Llama-3.2-1B shape), saved once as a Hugging Face folder
(config.json + model.safetensors + tokenizer) that all engines load.
"""

from __future__ import annotations

import argparse
import json
import random
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

# SmolLM2-135M's shape (head_dim 64: inside vLLM-CPU's supported set).
SMOLLM2_135M_SHAPE: dict[str, Any] = {
    "hidden_size": 576,
    "num_hidden_layers": 30,
    "num_attention_heads": 9,
    "num_key_value_heads": 3,
    "intermediate_size": 1536,
    "vocab_size": 49152,
    "tie_word_embeddings": True,
    "rope_theta": 100000.0,
    "max_position_embeddings": 8192,
    "rms_norm_eps": 1e-5,
}

# Llama-3.2-1B's shape (a ~1.2B-parameter model; rope scaling left out, max positions cut).
LLAMA_1B_SHAPE: dict[str, Any] = {
    "hidden_size": 2048,
    "num_hidden_layers": 16,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "intermediate_size": 8192,
    "vocab_size": 128256,
    "tie_word_embeddings": True,
    "rope_theta": 500000.0,
    "max_position_embeddings": 8192,
    "rms_norm_eps": 1e-5,
}

SHAPES: dict[str, dict[str, Any]] = {"smollm2-135m": SMOLLM2_135M_SHAPE, "llama-1b": LLAMA_1B_SHAPE}

# Bump when the folder's contents change, so an old cached folder is rebuilt.
_MODEL_FORMAT_VERSION = 1


@dataclass(frozen=True)
class BenchRequest:
    """One request of the workload: prompt token ids and the exact number of tokens to generate."""

    prompt_token_ids: list[int]
    max_tokens: int


@dataclass(frozen=True)
class ModelShape:
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    intermediate_size: int
    vocab_size: int

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    def linear_shapes(self) -> list[tuple[str, int, int]]:
        """(name, in_features, out_features) of every matmul in one decoder layer."""
        h, kv = self.hidden_size, self.num_key_value_heads * self.head_dim
        i = self.intermediate_size
        return [
            ("q_proj", h, h),
            ("k_proj", h, kv),
            ("v_proj", h, kv),
            ("o_proj", h, h),
            ("gate_proj", h, i),
            ("up_proj", h, i),
            ("down_proj", i, h),
        ]

    def fused_linear_shapes(self) -> list[tuple[int, int]]:
        """(in_features, out_features) of a decoder layer's GEMMs as pdserve runs them: qkv,
        o, gate_up, down."""
        h, kv = self.hidden_size, self.num_key_value_heads * self.head_dim
        i = self.intermediate_size
        return [(h, h + 2 * kv), (h, h), (h, 2 * i), (i, h)]

    def random_layer_weights(self, num_layers: int | None = None) -> list[list[Any]]:
        """Per decoder layer, its four fused GEMM weights ``[out, in]`` (torch tensors, fp32
        N(0, 0.02^2)), from torch's global generator: seed it first for repeatable weights.
        torch is imported here, not at the top: this module stays importable without it."""
        import torch

        return [
            [torch.randn(n, k) * 0.02 for k, n in self.fused_linear_shapes()]
            for _ in range(self.num_hidden_layers if num_layers is None else num_layers)
        ]

    @property
    def params_per_layer(self) -> int:
        return sum(k * n for _, k, n in self.linear_shapes())

    @property
    def params_in_linear_layers(self) -> int:
        """Weights every sampled token multiplies through (all decoder layers, lm_head
        excluded)."""
        return self.num_hidden_layers * self.params_per_layer

    @property
    def last_layer_unsampled_skip(self) -> int:
        """Weights of the last layer a token nobody samples (a prompt token but the last) does
        not multiply through: all but its k and v projections, whose K/V later tokens read."""
        kv = self.num_key_value_heads * self.head_dim
        return self.params_per_layer - 2 * self.hidden_size * kv

    @property
    def lm_head_params(self) -> int:
        return self.hidden_size * self.vocab_size


def model_shape(name: str = "smollm2-135m") -> ModelShape:
    s = SHAPES[name]
    return ModelShape(
        hidden_size=int(s["hidden_size"]),
        num_hidden_layers=int(s["num_hidden_layers"]),
        num_attention_heads=int(s["num_attention_heads"]),
        num_key_value_heads=int(s["num_key_value_heads"]),
        intermediate_size=int(s["intermediate_size"]),
        vocab_size=int(s["vocab_size"]),
    )


def make_workload(
    num_requests: int,
    prompt_len_range: tuple[int, int],
    output_len_range: tuple[int, int],
    vocab_size: int,
    seed: int,
) -> list[BenchRequest]:
    """Random token-id prompts, lengths uniform in the inclusive ranges, no special ids (0-2)."""
    rng = random.Random(seed)
    requests = []
    for _ in range(num_requests):
        prompt_len = rng.randint(*prompt_len_range)
        output_len = rng.randint(*output_len_range)
        prompt = [rng.randrange(3, vocab_size) for _ in range(prompt_len)]
        requests.append(BenchRequest(prompt_token_ids=prompt, max_tokens=output_len))
    return requests


def workload_to_json(requests: list[BenchRequest]) -> list[dict[str, object]]:
    return [asdict(r) for r in requests]


def unsampled_prompt_skip(shape: ModelShape, prompt_len: int) -> tuple[float, float]:
    """(linear, attention) FLOPs a prompt of ``prompt_len`` tokens need not spend: its tokens but
    the last skip the last layer past its K/V (``last_layer_unsampled_skip``) and that layer's
    attention (positions 0 .. prompt_len - 2 read 1 .. prompt_len - 1 keys)."""
    unsampled = prompt_len - 1
    linear = 2.0 * shape.last_layer_unsampled_skip * unsampled
    attention = 4.0 * shape.hidden_size * unsampled * prompt_len / 2
    return linear, attention


def workload_flops(requests: list[BenchRequest], shape: ModelShape) -> dict[str, float]:
    """The matmul work the workload needs at minimum, in FLOPs.

    Every request forwards ``prompt_len + max_tokens - 1`` tokens (the last sampled token is never
    fed back). Per forwarded token: ``2 * params_in_linear_layers``, less, for the prompt's
    tokens but its last (whose hidden state nobody samples), the last layer's weights past its
    K/V (``last_layer_unsampled_skip``) and that layer's attention. The lm_head runs only for
    the ``max_tokens`` positions whose logits are sampled. Causal attention for the token at
    position ``p`` (0-based) reads ``p + 1`` keys: ``QK^T`` and ``PV`` cost
    ``2 * 2 * num_heads * head_dim * (p + 1)`` per layer.

        positions   0 1 2 ... L-1        (L = forwarded tokens)
        keys read   1 2 3 ... L          sum = L (L + 1) / 2
    """
    linear = lm_head = attention = 0.0
    for r in requests:
        num_forwarded = len(r.prompt_token_ids) + r.max_tokens - 1
        skip_linear, skip_attention = unsampled_prompt_skip(shape, len(r.prompt_token_ids))
        linear += 2.0 * shape.params_in_linear_layers * num_forwarded - skip_linear
        lm_head += 2.0 * shape.lm_head_params * r.max_tokens
        keys_read = num_forwarded * (num_forwarded + 1) / 2
        attention += 4.0 * shape.hidden_size * shape.num_hidden_layers * keys_read
        attention -= skip_attention
    return {
        "linear": linear,
        "lm_head": lm_head,
        "attention": attention,
        "total": linear + lm_head + attention,
    }


def _write_tokenizer(folder: Path, vocab_size: int) -> None:
    """A word-level tokenizer covering every id (``<t17>`` is id 17), so any id detokenizes."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    vocab = {tok: i for i, tok in enumerate(specials)}
    vocab.update({f"<t{i}>": i for i in range(len(specials), vocab_size)})
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<|endoftext|>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.decoder = decoders.WordPiece(prefix="##", cleanup=False)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<|endoftext|>",
        eos_token="<|endoftext|>",
        unk_token="<|endoftext|>",
        pad_token="<|endoftext|>",
    )
    fast.save_pretrained(folder)


BENCH_DIR = Path.home() / ".cache" / "pdserve" / "bench"
DEFAULT_MODEL_DIR = BENCH_DIR / "smollm2-135m-shape-random-fp32"


def default_model_dir(shape: str, checkpoint_dtype: str = "float32") -> Path:
    """Where the benchmarks keep the random model of ``shape`` (made once, then reused)."""
    if checkpoint_dtype != "float32":
        return BENCH_DIR / f"{shape}-shape-random-{checkpoint_dtype}"
    return (
        DEFAULT_MODEL_DIR if shape == "smollm2-135m" else BENCH_DIR / f"{shape}-shape-random-fp32"
    )


def add_checkpoint_dtype(parser: argparse.ArgumentParser, more: str = "") -> None:
    """``--checkpoint-dtype float32|bfloat16``: the random model's stored weights (every engine
    still runs in float32; bfloat16 is what most published checkpoints are)."""
    parser.add_argument(
        "--checkpoint-dtype",
        choices=["float32", "bfloat16"],
        default="float32",
        help="the random model's stored weights; bfloat16 is what most published checkpoints "
        "are (every engine still runs in float32)" + more,
    )


def ensure_model_folder(
    folder: Path, seed: int = 0, shape: str = "smollm2-135m", checkpoint_dtype: str = "float32"
) -> Path:
    """Create the random-weight model folder once; reuse it when it is already complete.
    ``checkpoint_dtype`` ``bfloat16`` stores the weights as bf16, as most published checkpoints
    are (the engines still run in float32; every weight value is then bf16-exact)."""
    marker = folder / "pdserve_bench_model.json"
    expected: dict[str, Any] = {
        "version": _MODEL_FORMAT_VERSION,
        "seed": seed,
        "shape": SHAPES[shape],
    }
    if checkpoint_dtype != "float32":
        expected["checkpoint_dtype"] = checkpoint_dtype
    if marker.exists() and json.loads(marker.read_text()) == expected:
        return folder

    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    folder.mkdir(parents=True, exist_ok=True)
    config = LlamaConfig(
        **SHAPES[shape],
        hidden_act="silu",
        bos_token_id=0,
        eos_token_id=0,
        pad_token_id=0,
        attention_bias=False,
        mlp_bias=False,
        initializer_range=0.02,
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config)  # fp32 parameters
    model.to(getattr(torch, checkpoint_dtype)).save_pretrained(folder, safe_serialization=True)
    _write_tokenizer(folder, int(SHAPES[shape]["vocab_size"]))
    marker.write_text(json.dumps(expected))
    return folder
