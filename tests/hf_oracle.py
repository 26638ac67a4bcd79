"""The correctness oracle: Hugging Face transformers' own greedy generate, in fp32."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

import torch


@lru_cache(maxsize=8)
def _load(folder: str):  # type: ignore[no-untyped-def]
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    model.eval()
    # Never stop at EOS: pdserve's side runs with ignore_eos, and generate would otherwise
    # merge the checkpoint's eos_token_id back in.
    model.generation_config.eos_token_id = None
    return model


def hf_greedy(
    folder: Path | str,
    prompt_ids: list[int],
    max_new_tokens: int,
    repetition_penalty: float = 1.0,
) -> list[int]:
    """Greedy continuation of one prompt, never stopping early (EOS ignored); with HF's own
    ``RepetitionPenaltyLogitsProcessor`` when ``repetition_penalty`` is not 1."""
    from transformers import GenerationConfig

    model = _load(str(folder))
    config = GenerationConfig(
        do_sample=False,
        max_new_tokens=max_new_tokens,
        min_new_tokens=0,
        eos_token_id=None,
        pad_token_id=0,
        bos_token_id=None,
        repetition_penalty=repetition_penalty,
    )
    with torch.inference_mode():
        out = model.generate(
            torch.tensor([prompt_ids]), generation_config=config, attention_mask=None
        )
    generated = out[0, len(prompt_ids) :].tolist()
    assert len(generated) == max_new_tokens, "HF stopped early: the oracle is misconfigured"
    return generated


def hf_logprobs(folder: Path | str, token_ids: list[int]) -> torch.Tensor:
    """log-softmax of the next-token logits at every position of ``token_ids``."""
    model = _load(str(folder))
    with torch.inference_mode():
        logits = model(torch.tensor([token_ids])).logits[0].float()
    return logits.log_softmax(dim=-1)
