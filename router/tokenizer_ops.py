"""The router's own tokenizer work (prompts, chat templates, token strings), shared by every
backend: the engines never see text they did not need to."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

# apply_chat_template's own arguments: a request's chat_template_kwargs cannot set them.
_RESERVED = frozenset(
    "messages conversation tools documents chat_template add_generation_prompt "
    "continue_final_message tokenize padding truncation max_length return_tensors "
    "return_dict return_assistant_tokens_mask tokenizer_kwargs".split()
)


@dataclass(frozen=True)
class ChatTemplateOptions:
    """How a chat renders besides its messages and tools (vLLM's chat request extras):
    ``add_generation_prompt`` opens the assistant's turn; ``continue_final_message`` leaves
    the last (assistant) message open for the model to go on with; ``kwargs`` are extra
    template variables (e.g. Qwen3's ``enable_thinking``)."""

    add_generation_prompt: bool = True
    continue_final_message: bool = False
    kwargs: Mapping[str, Any] = field(default_factory=dict)

    def check(self, messages: Sequence[Mapping[str, Any]]) -> None:
        """Raises ValueError naming the field when the options cannot apply to ``messages``."""
        if self.continue_final_message:
            if self.add_generation_prompt:
                raise ValueError(
                    "continue_final_message: cannot be combined with add_generation_prompt "
                    "(set add_generation_prompt to false)"
                )
            if not messages or messages[-1].get("role") != "assistant":
                raise ValueError("continue_final_message: the last message must be the assistant's")
        taken = sorted(k for k in self.kwargs if k in _RESERVED)
        if taken:
            raise ValueError(
                f"chat_template_kwargs: {', '.join(map(repr, taken))} cannot be set here "
                "(the request's own fields set them)"
            )


DEFAULT_CHAT_OPTIONS = ChatTemplateOptions()


class TokenizerOps:
    def __init__(self, model_path: str, chat_template: str | None = None) -> None:
        """``chat_template``: Jinja text that replaces the tokenizer's own (load_chat_template)."""
        self.tokenizer: Any = load_tokenizer(model_path)
        if chat_template is not None:
            self.tokenizer.chat_template = chat_template

    def tokenize(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=add_special_tokens))

    def token_strings(self, token_ids: Sequence[int]) -> list[str]:
        return list(self.tokenizer.batch_decode([[t] for t in token_ids]))

    def detokenize(self, token_ids: Sequence[int]) -> str:
        return str(self.tokenizer.decode(list(token_ids), skip_special_tokens=False))

    def render_chat(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None = None,
        options: ChatTemplateOptions = DEFAULT_CHAT_OPTIONS,
    ) -> list[int]:
        """Prompt ids from the tokenizer's chat template, as ``options`` say (by default the
        generation prompt appended). Tools go to the template as ``tools`` (templates that do
        not render tools ignore them)."""
        if not getattr(self.tokenizer, "chat_template", None):
            raise ValueError("messages: this model's tokenizer has no chat template")
        options.check(messages)
        try:
            text = self.tokenizer.apply_chat_template(
                messages,
                tools=tools,
                tokenize=False,
                add_generation_prompt=options.add_generation_prompt,
                continue_final_message=options.continue_final_message,
                **options.kwargs,
            )
        except Exception as e:  # jinja errors for messages the template cannot render
            raise ValueError(f"messages: the chat template failed: {e}") from e
        # The template writes any BOS itself.
        return self.tokenize(str(text), add_special_tokens=False)


def load_chat_template(value: str | None) -> str | None:
    """``--chat-template`` as vLLM takes it: a file's path, or the template text itself. The
    template is parsed here, so a server with a broken one refuses to start. Raises
    ValueError naming the flag."""
    if value is None:
        return None
    from pathlib import Path

    import jinja2

    # The environment apply_chat_template renders with (its loop controls and `generation`
    # tag): a template it renders must not be refused here, as a plain jinja2 parse refused
    # `{% break %}`.
    from transformers.utils.chat_template_utils import _compile_jinja_template

    path = Path(value)
    if path.is_file():
        text = path.read_text(encoding="utf-8")
    elif "{{" in value or "{%" in value:
        text = value
    else:
        raise ValueError(f"--chat-template: {value!r} is neither a file nor a Jinja template")
    try:
        _compile_jinja_template(text)
    except jinja2.TemplateSyntaxError as e:
        raise ValueError(f"--chat-template: line {e.lineno}: {e.message}") from None
    return text


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
