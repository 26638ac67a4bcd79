"""The router's own tokenizer work (prompts, chat templates, token strings), shared by every
backend: the engines never see text they did not need to."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


class TokenizerOps:
    def __init__(self, model_path: str) -> None:
        self.tokenizer: Any = load_tokenizer(model_path)

    def tokenize(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=add_special_tokens))

    def token_strings(self, token_ids: Sequence[int]) -> list[str]:
        return list(self.tokenizer.batch_decode([[t] for t in token_ids]))

    def detokenize(self, token_ids: Sequence[int]) -> str:
        return str(self.tokenizer.decode(list(token_ids), skip_special_tokens=False))

    def render_chat(
        self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None
    ) -> list[int]:
        """Prompt ids from the tokenizer's chat template, generation prompt appended. Tools
        go to the template as ``tools`` (templates that do not render tools ignore them)."""
        if not getattr(self.tokenizer, "chat_template", None):
            raise ValueError("messages: this model's tokenizer has no chat template")
        try:
            text = self.tokenizer.apply_chat_template(
                messages, tools=tools, tokenize=False, add_generation_prompt=True
            )
        except Exception as e:  # jinja errors for messages the template cannot render
            raise ValueError(f"messages: the chat template failed: {e}") from e
        # The template writes any BOS itself.
        return self.tokenize(str(text), add_special_tokens=False)


def load_tokenizer(model_path: str) -> Any:
    """The model's tokenizer. A folder with ``tokenizer.json`` (every Llama-family checkpoint
    pdserve serves) loads as ``PreTrainedTokenizerFast``, which does not import torch:
    ``AutoTokenizer`` does, and the router has no model to run."""
    from pathlib import Path

    if (Path(model_path) / "tokenizer.json").is_file():
        from transformers import PreTrainedTokenizerFast

        return PreTrainedTokenizerFast.from_pretrained(model_path)
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model_path)
