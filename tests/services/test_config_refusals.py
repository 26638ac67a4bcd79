"""A configuration the engine cannot take stops ``pdserve serve`` with one line naming it and exit
status 2, in both modes: colocated, and disaggregated, where each worker refuses it the same way
(they used to end in a traceback, and a max_model_len past the model's positions was quietly
cut to the model's own)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from engine.model_card import resolve_max_model_len
from tests.conftest import TINY_ARCHS

pytestmark = pytest.mark.timeout(300)


def test_max_model_len_is_the_model_s_or_less() -> None:
    assert resolve_max_model_len(None, 2048) == 2048
    assert resolve_max_model_len(512, 2048) == 512
    assert resolve_max_model_len(2048, 2048) == 2048
    with pytest.raises(ValueError, match=r"max_model_len 4096 is longer than the model's "
                       r"max_position_embeddings \(2048\)"):  # fmt: skip
        resolve_max_model_len(4096, 2048)
    with pytest.raises(ValueError, match="max_model_len must be positive, got 0"):
        resolve_max_model_len(0, 2048)


@pytest.fixture(scope="module")
def llama(model_factory) -> Path:  # type: ignore[no-untyped-def]
    return model_factory("llama", **TINY_ARCHS["llama"])


@pytest.mark.parametrize("mode", [["--colocated"], []], ids=["colocated", "disaggregated"])
@pytest.mark.parametrize(
    "flags,message",
    [
        (["--max-model-len", "100000"], "error: max_model_len 100000 is longer than the model's"),
        (["--max-model-len", "0"], "error: max_model_len must be positive, got 0"),
        (["--max-num-seqs", "0"], "error: max_num_seqs must be positive, got 0"),
        (["--max-queue", "0"], "error: --max-queue must be at least 1, got 0"),
        (["--grpc-keepalive-s", "-1"], "error: --grpc-keepalive-s must be between 0 and 86400"),
    ],
    ids=[
        "max-model-len-past-positions",
        "max-model-len-0",
        "max-num-seqs-0",
        "max-queue-0",
        "grpc-keepalive-negative",
    ],
)
def test_a_configuration_the_engine_refuses_stops_the_server(
    llama: Path, mode: list[str], flags: list[str], message: str
) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "pdserve", "serve", *mode, "--model", str(llama),
         "--grpc-port", "0", "--http-port", "0", "--kv-transport", "tcp", *flags],
        capture_output=True, text=True, timeout=240,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr[-2000:]
    assert message in done.stderr, done.stderr[-2000:]
    assert "Traceback" not in done.stderr, done.stderr[-2000:]


@pytest.mark.parametrize(
    "flags,message",
    [
        (["--max-model-len", "100000"], "error: max_model_len 100000 is longer than the model's"),
        (["--grpc-min-client-ping-s", "nan"], "error: --grpc-min-client-ping-s must be between"),
    ],
    ids=["max-model-len-past-positions", "grpc-min-client-ping-nan"],
)
def test_a_router_refuses_what_it_or_its_workers_would(
    llama: Path, flags: list[str], message: str
) -> None:
    """``pdserve router`` (workers elsewhere, e.g. other pods) holds the same lines, before it
    dials anyone."""
    done = subprocess.run(
        [sys.executable, "-m", "pdserve", "router", "--model", str(llama), "--decode",
         "127.0.0.1:1", "--prefill", "127.0.0.1:2", "--grpc-port", "0", "--http-port", "0",
         *flags],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr[-2000:]
    assert message in done.stderr, done.stderr[-2000:]
    assert "Traceback" not in done.stderr
