"""``--chat-template`` (vLLM's flag): a server renders chats with the given template instead of
the tokenizer's, in both modes, whether given as a file or as the text; a template that is not
there or does not parse stops the server before it loads anything, naming the flag."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from transformers import PreTrainedTokenizerFast

from router.tokenizer_ops import load_chat_template
from tests.router.server_harness import start_server

pytestmark = pytest.mark.timeout(300)

TEMPLATE = (
    "{% for m in messages %}[{{ m['role'] | upper }}] {{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}[ASSISTANT] {% endif %}"
)
CHAT = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hello"}]


def test_load_chat_template(tmp_path: Path) -> None:
    path = tmp_path / "chat.jinja"
    path.write_text(TEMPLATE)
    assert load_chat_template(str(path)) == TEMPLATE
    assert load_chat_template(TEMPLATE) == TEMPLATE
    assert load_chat_template(None) is None
    with pytest.raises(ValueError, match=r"--chat-template: 'no/such\.jinja' is neither"):
        load_chat_template("no/such.jinja")
    with pytest.raises(ValueError, match="--chat-template: line 1: "):
        load_chat_template("{% for m in messages %}{{ m }}")  # no endfor
    # What apply_chat_template renders is taken: loop controls and the `generation` tag
    # (assistant masks), which a plain jinja2 parse refused.
    tags = (
        "{% for m in messages %}{% if loop.index > 2 %}{% break %}{% endif %}"
        "{% generation %}{{ m['content'] }}{% endgeneration %}{% endfor %}"
    )
    assert load_chat_template(tags) == tags


@pytest.mark.parametrize("colocated", [True, False], ids=["colocated", "disaggregated"])
def test_a_server_renders_with_the_given_template(
    llama: Path, tmp_path: Path, colocated: bool
) -> None:
    path = tmp_path / "chat.jinja"
    path.write_text(TEMPLATE)
    given = str(path) if colocated else TEMPLATE  # a file in one mode, the text in the other
    tokenizer = PreTrainedTokenizerFast.from_pretrained(str(llama))
    rendered = tokenizer.apply_chat_template(
        CHAT, chat_template=TEMPLATE, tokenize=False, add_generation_prompt=True
    )
    assert rendered.startswith("[SYSTEM] be brief\n")
    expected = tokenizer.encode(rendered, add_special_tokens=False)
    server = start_server(llama, "--chat-template", given, colocated=colocated)
    try:
        with server.http(timeout=60) as http:
            tokens = http.post("/tokenize", json={"messages": CHAT}).json()["tokens"]
            assert tokens == expected
            chat = http.post("/v1/chat/completions", json={"model": "tiny", "messages": CHAT,
                                                           "max_tokens": 3})  # fmt: skip
            assert chat.status_code == 200, chat.text
            assert chat.json()["usage"]["prompt_tokens"] == len(expected)
        server.wait_pool_free()
    finally:
        assert server.stop() == 0, "".join(server.lines)


@pytest.mark.parametrize("mode", [["--colocated"], []], ids=["colocated", "disaggregated"])
def test_a_bad_template_stops_the_server_before_it_loads(tmp_path: Path, mode: list[str]) -> None:
    # The model folder is empty: the flag is checked before anything is loaded or started.
    done = subprocess.run(
        [sys.executable, "-m", "pdserve", "serve", *mode, "--model", str(tmp_path),
         "--chat-template", "{% if x %}unclosed"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert "--chat-template: line 1: " in done.stderr, done.stderr
