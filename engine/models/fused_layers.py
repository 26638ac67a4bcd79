"""All decoder layers of a Llama-family model as one call of the compiled CPU kernels.

``FusedLayers`` holds the layers' weights the way ``kernels.cpu``'s ``decoder_layers`` takes them
(one list per argument, an entry per layer), gathered once after the weights are packed, so a
step passes the same lists and only its own tensors. The kernel runs the per-kernel Python
layer's ops in the same order (the same bits); it saves the Python and the dispatch between
them, and with one call a step instead of one a layer, those of ~30 arguments per layer.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from engine.attention.backend import AttentionMetadata
from engine.attention.output_rows import OutputRows
from engine.models.layers import PackedLinear, StepRotary

if TYPE_CHECKING:
    from engine.models.llama import LlamaDecoderLayer


@dataclass(frozen=True)
class FusedLayers:
    input_norms: list[torch.Tensor]
    post_norms: list[torch.Tensor]
    eps: float
    qkv: list[torch.Tensor]  # packed weights (PackedLinear.packed)
    qkv_bias: list[torch.Tensor | None]
    o: list[torch.Tensor]
    o_bias: list[torch.Tensor | None]
    gate_up: list[torch.Tensor]
    down: list[torch.Tensor]
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate: int
    scale: float

    @classmethod
    def of(cls, layers: Sequence[LlamaDecoderLayer]) -> FusedLayers:
        """From layers whose ``can_fuse()`` holds (every linear packed, no q/k norm)."""
        first = layers[0]
        attn, mlp = first.self_attn, first.mlp
        return cls(
            input_norms=[layer.input_layernorm.weight for layer in layers],
            post_norms=[layer.post_attention_layernorm.weight for layer in layers],
            eps=first.input_layernorm.eps,
            qkv=[_packed(layer.self_attn.qkv_proj) for layer in layers],
            qkv_bias=[layer.self_attn.qkv_proj.bias for layer in layers],
            o=[_packed(layer.self_attn.o_proj) for layer in layers],
            o_bias=[layer.self_attn.o_proj.bias for layer in layers],
            gate_up=[_packed(layer.mlp.gate_up_proj) for layer in layers],
            down=[_packed(layer.mlp.down_proj) for layer in layers],
            num_heads=attn.num_heads,
            num_kv_heads=attn.num_kv_heads,
            head_dim=attn.head_dim,
            intermediate=mlp.intermediate_size,
            scale=attn.scale,
        )

    def __call__(
        self,
        kernels: Any,
        x: torch.Tensor,
        rotary: StepRotary,
        kv_caches: Sequence[tuple[torch.Tensor, torch.Tensor]],
        metas: Sequence[AttentionMetadata],
        covered: int,
        out_rows: OutputRows | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``(last layer's output, residual stream)`` after every layer, the cpu attention
        backend's KV store and paged attention inside each; ``metas`` (per layer) differ only
        in their sliding window. ``covered``: rows the step's requests own (the rest is
        padding). With ``out_rows``, the last layer computes only those rows' output and
        returns theirs (engine.attention.output_rows)."""
        meta = metas[0]
        rows = out_rows.meta if out_rows is not None else None
        out: tuple[torch.Tensor, torch.Tensor] = kernels.decoder_layers(
            x,
            self.input_norms,
            self.post_norms,
            self.eps,
            self.qkv,
            self.qkv_bias,
            self.o,
            self.o_bias,
            self.gate_up,
            self.down,
            self.num_heads,
            self.num_kv_heads,
            self.head_dim,
            self.intermediate,
            rotary.cos,
            rotary.sin,
            rotary.positions,
            [k for k, _ in kv_caches],
            [v for _, v in kv_caches],
            meta.slot_mapping,
            meta.block_tables,
            meta.query_start_loc,
            meta.seq_lens,
            covered,
            self.scale,
            [m.sliding_window or 0 for m in metas],
            None if out_rows is None else out_rows.rows,
            None if rows is None else rows.block_tables,
            None if rows is None else rows.query_start_loc,
            None if rows is None else rows.seq_lens,
        )
        return out


def _packed(linear: torch.nn.Module) -> torch.Tensor:
    assert isinstance(linear, PackedLinear), "fused layers need every linear packed"
    return linear.packed
