"""`pdserve serve` in disaggregated mode, driven by the official openai client: the router
process, a prefill worker and a decode worker (KV over TCP) give HF's greedy tokens; a
cancelled stream leaves the decode pool free; a bad request gets 400 and serving goes on; the
workers run at the niceness their flags ask."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest

from tests.conftest import TINY_ARCHS
from tests.hf_oracle import hf_greedy
from tests.router.server_harness import Server, start_server
from tests.services.workers import child_pids


@pytest.fixture(scope="module")
def server(model_factory) -> Iterator[tuple[Server, Path]]:  # type: ignore[no-untyped-def]
    model = model_factory("llama", **TINY_ARCHS["llama"])
    srv = start_server(
        model,
        "--num-kv-blocks",
        "128",
        "--kv-transport",
        "tcp",
        "--prefill-max-num-batched-tokens",
        "16",
        *("--decode-nice", "3", "--prefill-nice", "1"),
        colocated=False,
    )
    try:
        yield srv, model
    finally:
        assert srv.stop() == 0


def test_completions_match_hf_through_the_router(server: tuple[Server, Path]) -> None:
    srv, model = server
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(model))
    client = openai.OpenAI(base_url=f"{srv.http_url}/v1", api_key="none")
    prompt = "the model serves tokens from a paged cache in the city"
    ids = tok.encode(prompt)
    expected = tok.decode(hf_greedy(model, ids, 12))
    out = client.completions.create(
        model="tiny", prompt=prompt, max_tokens=12, temperature=0, extra_body={"ignore_eos": True}
    )
    assert out.choices[0].text == expected
    assert out.usage is not None and out.usage.prompt_tokens == len(ids)
    chunks = client.completions.create(
        model="tiny",
        prompt=prompt,
        max_tokens=12,
        temperature=0,
        stream=True,
        extra_body={"ignore_eos": True},
    )
    assert "".join(c.choices[0].text for c in chunks if c.choices) == expected
    srv.wait_pool_free(timeout_s=20)


def test_cancelled_stream_and_bad_input(server: tuple[Server, Path]) -> None:
    srv, _ = server
    body = {
        "model": "tiny",
        "prompt": "a long answer please",
        "max_tokens": 300,
        "temperature": 0,
        "stream": True,
        "ignore_eos": True,
    }
    with httpx.stream("POST", f"{srv.http_url}/v1/completions", json=body, timeout=60) as r:
        assert r.status_code == 200
        for i, _line in enumerate(r.iter_lines()):
            if i >= 4:
                break  # the client goes away mid-stream
    srv.wait_pool_free(timeout_s=20)
    bad = httpx.post(
        f"{srv.http_url}/v1/completions",
        json={"model": "tiny", "prompt": "x", "max_tokens": 0},
        timeout=30,
    )
    assert bad.status_code == 400 and "max_tokens" in bad.text
    ok = httpx.post(
        f"{srv.http_url}/v1/completions",
        json={"model": "tiny", "prompt": "x", "max_tokens": 3},
        timeout=60,
    )
    assert ok.status_code == 200


def test_workers_run_at_the_niceness_asked(server: tuple[Server, Path]) -> None:
    srv, _ = server
    niceness = {}
    for pid in child_pids(srv.process.pid):
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        role = "decode" if b"decode_service" in cmdline else "prefill"
        niceness[role] = os.getpriority(os.PRIO_PROCESS, pid)
    assert niceness == {"decode": 3, "prefill": 1}


def test_a_niceness_out_of_range_is_refused_before_any_worker_starts(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "pdserve", "serve", "--model", str(tmp_path), "--decode-nice", "-5"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2, done.stderr
    assert "--decode-nice must be 0 (no change) to 19 (lowest priority), got -5" in done.stderr
