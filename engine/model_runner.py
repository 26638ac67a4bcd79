"""Executes one ``SchedulerOutput``: swaps, builds the flat batch, runs the model, samples.

The runner alone owns the device: the model weights, the KV pool and the sampler's state. On
CPU it switches the model to the compiled kernels of ``kernels/cpu`` when they are available
(``kernels.cpu.load``; ``PDSERVE_CPU_KERNELS=0`` keeps the plain-torch path). On CUDA it runs
the layers' elementwise ops as Triton kernels (``kernels.pointwise``; ``PDSERVE_GPU_POINTWISE=0``
keeps the torch ops).
"""

from __future__ import annotations

import dataclasses
import logging
import os
from dataclasses import dataclass

import torch

from engine.attention.backend import AttentionBackend, AttentionMetadata
from engine.attention.output_rows import OutputRows
from engine.kv_cache import KVCache
from engine.model_config import ModelConfig
from engine.models.llama import LlamaForCausalLM
from engine.models.pointwise_check import check_pointwise
from engine.outputs import SampledToken
from engine.sampler import Sampler, SamplingRow, takes_raw_argmax
from engine.scheduler_output import SchedulerOutput
from engine.structured.masks import GrammarMasks

GPU_POINTWISE_ENV = "PDSERVE_GPU_POINTWISE"
logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class StepResult:
    sampled: dict[str, SampledToken]  # request id -> the token it sampled this step


class ModelRunner:
    def __init__(
        self,
        model_config: ModelConfig,
        model: LlamaForCausalLM,
        kv_cache: KVCache,
        backend: AttentionBackend,
        device: torch.device,
    ) -> None:
        self.model_config = model_config
        self.model = model
        self.kv_cache = kv_cache
        self.backend = backend
        self.device = device
        self.block_size = kv_cache.spec.block_size
        grammars = GrammarMasks(
            model_config.path, model_config.vocab_size, model_config.eos_token_ids
        )
        self.sampler = Sampler(model_config.eos_token_ids, grammars)
        self._windows = model_config.sliding_windows or (None,) * model_config.num_layers
        if device.type == "cpu":
            from kernels.cpu import load

            kernels = load()
            if kernels is not None:
                model.use_cpu_kernels(kernels)
                self.sampler.use_argmax(kernels.argmax)
        elif device.type == "cuda" and os.environ.get(GPU_POINTWISE_ENV, "1") != "0":
            self._use_triton_pointwise()

    @torch.inference_mode()
    def _use_triton_pointwise(self) -> None:
        """The layers' elementwise ops as Triton kernels, once they pass ``check_pointwise`` on
        this device at the model's shapes; otherwise the torch ops, and one warning."""
        from kernels.pointwise import TritonPointwise

        mc = self.model_config
        kernels = TritonPointwise()
        problem = check_pointwise(
            kernels,
            self.device,
            mc.dtype,
            mc.hidden_size,
            mc.num_heads,
            mc.num_kv_heads,
            mc.head_dim,
            mc.intermediate_size,
        )
        if problem is not None:
            logger.warning(
                "Triton elementwise kernels off, torch ops kept (%s=0 does this quietly): %s",
                GPU_POINTWISE_ENV,
                problem,
            )
            return
        self.model.use_pointwise_kernels(kernels)

    @torch.inference_mode()
    def execute(self, output: SchedulerOutput) -> StepResult:
        self.sampler.forget(output.finished_request_ids)
        self.kv_cache.swap_out(output.blocks_to_swap_out)
        self.kv_cache.swap_in(output.blocks_to_swap_in)
        if not output.scheduled:
            return StepResult({})
        input_ids, positions, meta = self._prepare_inputs(output)
        self.backend.prepare(meta, self.block_size)
        metas = [
            meta if w is None else dataclasses.replace(meta, sliding_window=w)
            for w in self._windows
        ]
        # Only the sampling requests' last rows leave the model (engine.attention.output_rows;
        # every row when each one samples, as in a decode step).
        sampling = [i for i, s in enumerate(output.scheduled) if s.sample]
        out_rows = (
            None if len(sampling) == meta.num_tokens else OutputRows.last_rows(meta, sampling)
        )
        hidden = self.model(
            input_ids, positions, self.kv_cache.layer_caches, metas, self.backend, out_rows
        )
        if not sampling:
            return StepResult({})
        sampling_rows = [
            SamplingRow(
                s.request_id,
                s.sampling_params,
                s.num_output_tokens,
                s.output_token_ids,
                s.prompt_token_ids,
            )
            for s in (output.scheduled[i] for i in sampling)
        ]
        tokens = self._sample(hidden, sampling_rows)
        return StepResult({r.request_id: t for r, t in zip(sampling_rows, tokens, strict=True)})

    def _sample(self, hidden: torch.Tensor, rows: list[SamplingRow]) -> list[SampledToken]:
        """One token per row of ``hidden``. Rows whose token is their logits' argmax and nothing
        else get it from the model's greedy head where it has one (no float32 logits: the same
        token); the others' logits go through the sampler."""
        plain = (
            [i for i, r in enumerate(rows) if takes_raw_argmax(r)]
            if self.model.has_greedy_head
            else []
        )
        if not plain:
            return self.sampler.sample(self.model.compute_logits(hidden), rows)
        rest = sorted(set(range(len(rows))) - set(plain))
        mine = hidden if not rest else hidden.index_select(0, self._index(plain))
        picked = self.model.greedy_tokens(mine).tolist()
        out = {i: SampledToken(t) for i, t in zip(plain, picked, strict=True)}
        if rest:
            logits = self.model.compute_logits(hidden.index_select(0, self._index(rest)))
            sampled = self.sampler.sample(logits, [rows[i] for i in rest])
            out.update(zip(rest, sampled, strict=True))
        return [out[i] for i in range(len(rows))]

    def _index(self, rows: list[int]) -> torch.Tensor:
        return torch.tensor(rows, dtype=torch.long, device=self.device)

    def _prepare_inputs(
        self, output: SchedulerOutput
    ) -> tuple[torch.Tensor, torch.Tensor, AttentionMetadata]:
        bs = self.block_size
        input_ids: list[int] = []
        positions: list[int] = []
        slots: list[int] = []
        query_lens: list[int] = []
        seq_lens: list[int] = []
        max_blocks = max(len(s.block_table) for s in output.scheduled)
        tables: list[list[int]] = []
        for s in output.scheduled:
            start, n = s.num_computed_tokens, s.num_scheduled_tokens
            input_ids.extend(s.token_ids)
            pos = range(start, start + n)
            positions.extend(pos)
            table = s.block_table
            slots.extend(table[p // bs] * bs + p % bs for p in pos)
            query_lens.append(n)
            seq_lens.append(start + n)
            tables.append(list(table) + [0] * (max_blocks - len(table)))
        dev = self.device

        def i32(x: list[int]) -> torch.Tensor:
            return torch.tensor(x, dtype=torch.int32, device=dev)

        qsl = [0]
        for n in query_lens:
            qsl.append(qsl[-1] + n)
        meta = AttentionMetadata(
            num_tokens=len(input_ids),
            num_seqs=len(query_lens),
            query_start_loc=i32(qsl),
            query_lens=i32(query_lens),
            context_lens=i32([s - q for s, q in zip(seq_lens, query_lens, strict=True)]),
            seq_lens=i32(seq_lens),
            block_tables=i32([x for t in tables for x in t]).view(len(tables), max_blocks),
            slot_mapping=torch.tensor(slots, dtype=torch.long, device=dev),
            max_query_len=max(query_lens),
            max_seq_len=max(seq_lens),
            query_lens_cpu=tuple(query_lens),
            seq_lens_cpu=tuple(seq_lens),
        )
        ids = torch.tensor(input_ids, dtype=torch.long, device=dev)
        pos_t = torch.tensor(positions, dtype=torch.long, device=dev)
        return ids, pos_t, meta
