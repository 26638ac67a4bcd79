"""The Llama family (Llama, Mistral, Qwen2 with qkv bias, Qwen3 with q/k norm) over a flat,
variable-length batch and a paged KV pool.

q/k/v and gate/up projections are fused into one GEMM each; the checkpoint loader splits HF's
separate weights into them. The residual stream is carried beside each layer's output, so the
add before every RMSNorm can be fused into it (``RMSNorm.add_forward``): the arithmetic is HF's,
``h = x + attn(norm(x)); out = h + mlp(norm(h))``, in the same order.

``use_cpu_kernels`` switches the model to the compiled CPU kernels (``kernels.cpu``).
"""

from __future__ import annotations

import os
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from engine.attention.backend import AttentionBackend, AttentionMetadata
from engine.attention.output_rows import OutputRows, RowsAttentionBackend
from engine.model_config import ModelConfig
from engine.models.fused_layers import FusedLayers
from engine.models.greedy_head import GreedyLmHead
from engine.models.layers import (
    PackedGateUpSiLU,
    PackedLinear,
    RMSNorm,
    RotaryEmbedding,
    StepRotary,
)
from engine.packed_weights import bf16_panels, empty_packed_weights, pack_into

# PDSERVE_FUSED_LAYERS=0 keeps the per-kernel Python layer on the CPU kernels (to profile the
# kernels one by one, or to compare).
FUSED_LAYERS_ENV = "PDSERVE_FUSED_LAYERS"


class LlamaAttention(nn.Module):
    def __init__(self, cfg: ModelConfig, has_qkv_bias: bool, has_qk_norm: bool) -> None:
        super().__init__()
        self.num_heads = cfg.num_heads
        self.num_kv_heads = cfg.num_kv_heads
        self.head_dim = cfg.head_dim
        self.q_size = cfg.num_heads * cfg.head_dim
        self.kv_size = cfg.num_kv_heads * cfg.head_dim
        self.scale = cfg.head_dim**-0.5
        self.qkv_proj = nn.Linear(
            cfg.hidden_size, self.q_size + 2 * self.kv_size, bias=has_qkv_bias
        )
        self.o_proj = nn.Linear(self.q_size, cfg.hidden_size, bias=False)
        self.q_norm = RMSNorm(cfg.head_dim, cfg.rms_norm_eps) if has_qk_norm else None
        self.k_norm = RMSNorm(cfg.head_dim, cfg.rms_norm_eps) if has_qk_norm else None

    def forward(
        self,
        x: torch.Tensor,
        rotary: StepRotary,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        meta: AttentionMetadata,
        backend: AttentionBackend,
        rows: OutputRows | None = None,
    ) -> torch.Tensor:
        """Every row's K/V into the cache, and the output of every row, or with ``rows`` (a
        ``RowsAttentionBackend``'s step: engine.attention.output_rows) of those rows alone."""
        n = x.shape[0]
        qkv = self.qkv_proj(x)
        q, k, v = qkv.split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        q = q.view(n, self.num_heads, self.head_dim)
        k = k.view(n, self.num_kv_heads, self.head_dim)
        v = v.view(n, self.num_kv_heads, self.head_dim)
        if self.q_norm is not None and self.k_norm is not None:
            q = self.q_norm(q)
            k = self.k_norm(k)
        q, k = rotary.apply(q, k)
        if rows is None:
            out = backend.forward(q, k, v, k_cache, v_cache, meta, self.scale)  # v: strided
        else:
            assert isinstance(backend, RowsAttentionBackend)
            q = q.index_select(0, rows.rows)
            out = backend.forward_rows(q, k, v, k_cache, v_cache, meta, rows, self.scale)
            n = len(rows)
        return self.o_proj(out.reshape(n, self.q_size))


class LlamaMLP(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.intermediate_size = cfg.intermediate_size
        self.gate_up_proj = nn.Linear(cfg.hidden_size, 2 * cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)
        self.kernels: Any = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if isinstance(self.gate_up_proj, PackedGateUpSiLU):  # the GEMM with its activation
            return self.down_proj(self.gate_up_proj(x))
        gate_up = self.gate_up_proj(x)
        if self.kernels is not None:
            return self.down_proj(self.kernels.silu_mul(gate_up))
        gate, up = gate_up.split(self.intermediate_size, dim=-1)
        return self.down_proj(F.silu(gate) * up)


class LlamaDecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, has_qkv_bias: bool, has_qk_norm: bool) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = LlamaAttention(cfg, has_qkv_bias, has_qk_norm)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = LlamaMLP(cfg)

    def forward(
        self,
        x: torch.Tensor,
        residual: torch.Tensor | None,
        rotary: StepRotary,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        meta: AttentionMetadata,
        backend: AttentionBackend,
        rows: OutputRows | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``(mlp output, residual stream)``: the layer's output is their sum, which the next
        layer's input norm (or the final norm) computes fused with its normalisation. With
        ``rows`` (the last layer of a step that needs no other row, on a
        ``RowsAttentionBackend``: engine.attention.output_rows), every row's K/V but only those
        rows' outputs."""
        if residual is None:  # first layer: x is the embedding, the stream starts there
            residual = x
            h = self.input_layernorm(x)
        else:
            h, residual = self.input_layernorm.add_forward(x, residual)
        h = self.self_attn(h, rotary, k_cache, v_cache, meta, backend, rows)
        if rows is not None:
            residual = residual.index_select(0, rows.rows)
        h, residual = self.post_attention_layernorm.add_forward(h, residual)
        return self.mlp(h), residual

    def can_fuse(self) -> bool:
        """True when the compiled ``decoder_layers`` can do this layer's work
        (``engine.models.fused_layers``): every linear packed (float32 on the CPU kernels) and
        no per-head q/k norm."""
        attn, mlp = self.self_attn, self.mlp
        linears = (attn.qkv_proj, attn.o_proj, mlp.gate_up_proj, mlp.down_proj)
        return attn.q_norm is None and all(isinstance(m, PackedLinear) for m in linears)


class LlamaForCausalLM(nn.Module):
    def __init__(
        self,
        cfg: ModelConfig,
        rotary: RotaryEmbedding,
        has_qkv_bias: bool = False,
        has_qk_norm: bool = False,
    ):
        """``rotary``: the position tables, built on the model's device in float32. The model
        is built to be filled from a checkpoint (model_loader.load_model, on the meta device)."""
        super().__init__()
        self.config = cfg
        # No random init for the embedding: on the meta device its normal_ runs through
        # torch._refs, whose first import is ~1 s of an engine's start.
        self.embed_tokens = nn.Embedding(
            cfg.vocab_size, cfg.hidden_size, _weight=torch.empty(cfg.vocab_size, cfg.hidden_size)
        )
        self.layers = nn.ModuleList(
            LlamaDecoderLayer(cfg, has_qkv_bias, has_qk_norm) for _ in range(cfg.num_layers)
        )
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.lm_head: nn.Module = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        if cfg.tie_word_embeddings:
            self.lm_head.weight = self.embed_tokens.weight
        self.rotary = rotary
        self.kernels: Any = None
        # Every decoder layer in one compiled call (engine.models.fused_layers) when the step
        # runs on the cpu attention backend; set by use_cpu_kernels.
        self.fused_layers = False
        self._fused: FusedLayers | None = None

    def use_pointwise_kernels(self, kernels: Any) -> None:
        """Run norms (with their residual adds), rotary and SiLU·mul on ``kernels``: the
        compiled CPU kernels, or ``kernels.pointwise.TritonPointwise`` on a GPU. Both offer
        ``rms_norm``, ``add_rms_norm``, ``rotary_`` and ``silu_mul``."""
        self.kernels = kernels
        for module in self.modules():
            if isinstance(module, RMSNorm | LlamaMLP):
                module.kernels = kernels

    def use_cpu_kernels(self, kernels: Any) -> None:
        """Run norms, rotary and SiLU·mul on the compiled CPU kernels, and in float32 also every
        linear layer (lm_head included) on weights packed once; the unpacked decoder weights
        are released (a tied lm_head gets its own packed copy; the embedding keeps its table).
        Call after the weights are loaded."""
        self.use_pointwise_kernels(kernels)
        if self.embed_tokens.weight.dtype != torch.float32:
            return
        # Every packed weight in one buffer on huge pages, in the order a step reads them; each
        # unpacked weight is released as soon as its packed copy is in. A weight bf16 holds
        # exactly is packed as bf16: half the stream, the same bits (engine.packed_weights).
        linears = {n: m for n, m in self.named_modules() if isinstance(m, nn.Linear)}
        shapes = [(m.out_features, m.in_features) for m in linears.values()]
        bf16 = bf16_panels([m.weight for m in linears.values()])
        views = empty_packed_weights(shapes, kernels, bf16)
        for name, view in zip(list(linears), views, strict=True):
            linear = linears.pop(name)
            parent, _, attr = name.rpartition(".")
            packed = pack_into(view, linear.weight, kernels)
            module: nn.Module
            if name == "lm_head":
                # A tied head's rows stay in the embedding table: the exact pass reads them.
                tied = linear.weight is self.embed_tokens.weight
                rows = linear.weight if tied else None
                module = GreedyLmHead.maybe(linear, kernels, packed, rows)
            elif attr == "gate_up_proj" and linear.bias is None:
                module = PackedGateUpSiLU(linear, kernels, packed)
            else:
                module = PackedLinear(linear, kernels, packed)
            setattr(self.get_submodule(parent), attr, module)
            del linear
        layers: list[LlamaDecoderLayer] = list(self.layers)  # type: ignore[arg-type]
        if all(layer.can_fuse() for layer in layers):
            self._fused = FusedLayers.of(layers)
        self.fused_layers = os.environ.get(FUSED_LAYERS_ENV, "1") != "0" and self._fused is not None

    def forward(
        self,
        input_ids: torch.Tensor,  # [num_tokens]
        positions: torch.Tensor,  # [num_tokens]
        kv_caches: list[tuple[torch.Tensor, torch.Tensor]],  # per layer (k_cache, v_cache)
        metas: list[AttentionMetadata],  # per layer (differs only for sliding windows)
        backend: AttentionBackend,
        out_rows: OutputRows | None = None,
    ) -> torch.Tensor:
        """Return the final hidden states ``[num_tokens, hidden_size]`` (after the norm), or
        with ``out_rows`` only those rows' ``[len(out_rows), hidden_size]``, in their order;
        where the backend can (``RowsAttentionBackend``), the last layer then runs q,
        attention, o and the MLP for those rows alone (engine.attention.output_rows)."""
        x = self.embed_tokens(input_ids)
        rotary = self.rotary.for_step(positions, x.dtype, self.kernels)
        residual: torch.Tensor | None = None
        if out_rows is not None and out_rows.covers(x.shape[0]):
            out_rows = None  # every row: the plain step
        if self.fused_layers and self._fused is not None and backend.name == "cpu":
            covered: int = backend.covered  # type: ignore[attr-defined]
            x, residual = self._fused(self.kernels, x, rotary, kv_caches, metas, covered, out_rows)
            return self.norm.add_forward(x, residual)[0]
        layers: list[LlamaDecoderLayer] = list(self.layers)  # type: ignore[arg-type]
        last = len(layers) - 1
        # The rows the last layer runs alone (its x and residual become theirs), if the backend
        # can (a runtime protocol check: only on steps that name rows).
        can = out_rows is not None and isinstance(backend, RowsAttentionBackend)
        last_rows = out_rows if can else None
        for i, (layer, (k_cache, v_cache), meta) in enumerate(
            zip(layers, kv_caches, metas, strict=True)
        ):
            rows = None
            if i == last and last_rows is not None:
                rows = last_rows.with_window(meta.sliding_window)
            x, residual = layer(x, residual, rotary, k_cache, v_cache, meta, backend, rows)
        if out_rows is not None and last_rows is None:  # the backend ran every row
            x = x.index_select(0, out_rows.rows)
            residual = None if residual is None else residual.index_select(0, out_rows.rows)
        if residual is None:
            return self.norm(x)
        return self.norm.add_forward(x, residual)[0]

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head(hidden).float()

    @property
    def has_greedy_head(self) -> bool:
        """Whether ``greedy_tokens`` finds greedy tokens without the full logits."""
        return isinstance(self.lm_head, GreedyLmHead)

    def greedy_tokens(self, hidden: torch.Tensor) -> torch.Tensor:
        """Each row's first maximal index of ``compute_logits(hidden)`` (``has_greedy_head``)."""
        assert isinstance(self.lm_head, GreedyLmHead)
        return self.lm_head.greedy(hidden)
