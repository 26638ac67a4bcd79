"""Shared fixtures: tiny random Hugging Face model folders, built once per test process."""

from __future__ import annotations

import os
import socket
import warnings
from pathlib import Path
from typing import Any

import pytest

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# Triton kernels run under Triton's CPU interpreter when there is no GPU. Triton reads this
# when it is first imported (transformers imports it), so it must be set before anything else.
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")


# The public default ports (`pdserve serve`'s HTTP and gRPC). The suite never binds them: it
# runs beside a real server on this machine and in parallel with itself. The controller process
# holds them for the whole run, so any test or server that tries fails with "address in use".
PUBLIC_DEFAULT_PORTS = (8000, 50051)


def pytest_configure(config: pytest.Config) -> None:
    if hasattr(config, "workerinput"):  # an xdist worker: the controller holds the ports
        return
    held = []
    for port in PUBLIC_DEFAULT_PORTS:
        for family, host in ((socket.AF_INET, "0.0.0.0"), (socket.AF_INET6, "::")):
            sock = socket.socket(family, socket.SOCK_STREAM)
            try:
                if family == socket.AF_INET6:
                    sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
                sock.bind((host, port))
                sock.listen(1)
            except OSError as e:
                sock.close()
                warnings.warn(f"cannot hold default port {host}:{port} ({e})", stacklevel=1)
                continue
            held.append(sock)
    config._pdserve_held_ports = held  # type: ignore[attr-defined]


# The demo model's chat template plus Qwen3's switch for its thinking block, so that the API
# tests can see a request's chat_template_kwargs reach the template; it refuses a switch that
# is not a boolean as templates refuse what they cannot render (raise_exception).
THINKING_SWITCH = (
    "{% if enable_thinking is defined and enable_thinking is not boolean %}"
    "{{ raise_exception('enable_thinking must be true or false') }}{% endif %}"
    "{% if add_generation_prompt and enable_thinking is defined and not enable_thinking %}"
    "<think>\n\n</think>\n\n{% endif %}"
)

# Tools and a conversation's tool calls, as a tool-calling model's template renders them
# (Hermes/Qwen2.5 write them in the system turn and as <tool_call> blocks), so that the tests
# can see a request's tools and call history reach the template.
TOOLS_SECTION = (
    "{% if tools %}<|im_start|>system\n<tools>{{ tools | tojson }}</tools><|im_end|>\n{% endif %}"
)
TOOL_HISTORY = (
    "{% for m in messages %}{% for c in m.tool_calls or [] %}"
    "<tool_call>{{ c.function | tojson }}</tool_call>{% endfor %}"
    "{% if m.tool_call_id %}<tool_response>{{ m.tool_call_id }}</tool_response>{% endif %}"
    "{% endfor %}"
)


@pytest.fixture(scope="session")
def tokenizer_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from transformers import PreTrainedTokenizerFast

    from engine.demo_model import CHAT_TEMPLATE, train_tokenizer

    folder = train_tokenizer(tmp_path_factory.mktemp("tokenizer"))
    tokenizer = PreTrainedTokenizerFast.from_pretrained(str(folder))
    tokenizer.chat_template = TOOLS_SECTION + CHAT_TEMPLATE + TOOL_HISTORY + THINKING_SWITCH
    tokenizer.save_pretrained(str(folder))
    return folder


@pytest.fixture(scope="session")
def model_factory(tmp_path_factory: pytest.TempPathFactory, tokenizer_dir: Path):
    """``model_factory(name, **shape)`` -> folder; cached per name for the session."""
    from engine.demo_model import make_random_model

    made: dict[str, Path] = {}

    def make(name: str, **kwargs: object) -> Path:
        if name not in made:
            folder = tmp_path_factory.mktemp(name)
            made[name] = make_random_model(folder, tokenizer_folder=tokenizer_dir, **kwargs)  # type: ignore[arg-type]
        return made[name]

    return make


TINY_ARCHS: dict[str, dict[str, Any]] = {
    "llama": dict(architecture="llama"),
    "qwen2": dict(architecture="qwen2", tie_word_embeddings=False),
    "qwen3": dict(architecture="qwen3", num_heads=4, num_kv_heads=1, head_dim=32),
    "mistral": dict(architecture="mistral", sliding_window=24, tie_word_embeddings=False),
}


@pytest.fixture(scope="session", params=["llama", "qwen2", "qwen3"])
def tiny_model(request: pytest.FixtureRequest, model_factory) -> Path:
    return model_factory(request.param, **TINY_ARCHS[request.param])
