"""Every container's argv, parsed by pdserve's own parser: today's examples parse cleanly, and
the pending examples fail only on the flags docs/kubernetes.md lists as pending."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helm.chart import (
    EXAMPLES,
    PENDING_EXAMPLES,
    containers,
    example_values,
    objects,
    render,
    render_example,
)
from tests.helm.cli_args import parse_pdserve_args

# The flags the chart passes that pdserve does not have yet, per role, and the issue that
# brings them. When one lands, test_pending_flags_are_still_missing fails: drop it here.
PENDING: dict[str, dict[str, int]] = {"router": {}, "worker": {}}
# Every pending feature on at once.
ALL_PENDING = {
    "controlPlane": {"mode": "redis"},
    "redis": {"auth": {"existingSecret": "r"}, "tls": {"enabled": True, "existingSecret": "t"}},
}


def _unknown_flags(args: list[str], role: str) -> set[str]:
    return parse_pdserve_args(args).unknown_flags


def _pending_of(role: str) -> dict[str, int]:
    return PENDING["router" if role == "router" else "worker"]


@pytest.mark.parametrize("example", EXAMPLES)
def test_every_container_args_parse_with_pdserve_parser(example: str) -> None:
    seen = set()
    for c in containers(objects(render_example(example))):
        if c.init or c.role == "redis":
            continue
        assert c.spec["command"] == ["pdserve"]
        assert c.spec["args"][0] == c.role  # one image, the role by command
        unknown = _unknown_flags(c.spec["args"], c.role)
        if example in PENDING_EXAMPLES:
            assert unknown <= set(_pending_of(c.role)), (c.role, unknown)
        else:
            assert not unknown, (c.role, unknown)
            parse_pdserve_args(c.spec["args"])  # and nothing else is missing
        seen.add(c.role)
    assert seen == {"router", "prefill", "decode"}


def test_pending_examples_do_need_pending_flags() -> None:
    for example in PENDING_EXAMPLES:
        needed = set()
        for c in containers(objects(render_example(example))):
            if not c.init and c.role != "redis":
                needed |= _unknown_flags(c.spec["args"], c.role)
        assert needed, f"{example} needs no pending flag: move it out of PENDING_EXAMPLES"


def test_pending_flags_are_still_missing() -> None:
    """All pending values on: the unknown flags are exactly PENDING, role by role."""
    for c in containers(objects(render(ALL_PENDING))):
        if c.init or c.role == "redis":
            continue
        assert _unknown_flags(c.spec["args"], c.role) == set(_pending_of(c.role)), c.role


def test_download_init_container_args_parse_with_the_hf_cli(tmp_path: Path) -> None:
    """The init container's `hf download` argv, run by the real hf CLI offline: it gets past
    argument parsing (exit 2 is a usage error) and stops where it would go to the network."""
    inits = [c for c in containers(objects(render_example("keda"))) if c.init]
    assert {c.role for c in inits} == {"router", "prefill", "decode"}
    hf = Path(sys.executable).with_name("hf")
    for c in inits:
        assert c.spec["command"] == ["hf", "download"]
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf")}
        args = [a.replace("/models/", f"{tmp_path}/models/") for a in c.spec["args"]]
        r = subprocess.run(
            [str(hf), "download", *args], capture_output=True, text=True, env=env, timeout=120
        )
        assert r.returncode == 1, r.stdout + r.stderr
        assert "offline mode is enabled" in r.stdout + r.stderr
    assert example_values("keda")["model"]["source"] == "huggingface"


def test_a_chat_template_reaches_the_router_verbatim() -> None:
    # Jinja's braces, both quotes and newlines: Helm must neither evaluate nor reflow them.
    template = (
        "{% for m in messages %}[{{ m['role'] | upper }}] {{ m[\"content\"] }}\n{% endfor %}"
        "{% if add_generation_prompt %}[ASSISTANT] {% endif %}"
    )
    rendered = render({"router": {"flags": {"chatTemplate": template}}})
    (router,) = [c for c in containers(objects(rendered)) if c.role == "router" and not c.init]
    args = router.spec["args"]
    assert args[args.index("--chat-template") + 1] == template
    assert not parse_pdserve_args(args).unknown_flags
