"""``pdserve plan`` end to end: a profile calibrated by driving a real (tiny) engine, then
simulated through the CLI into pdserve bench's files, then searched into Helm values."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import yaml

from pdserve.bench.records import RequestRecord
from pdserve.cli import main
from pdserve.plan.profile_format import load_profile, save_profile
from tests.plan.conftest import make_profile

CONFIG = """\
[cluster]
num_prefill = 1
num_decode = 2
profile = "{profile}"

[placement]
groups = [{{ cores = 1, workers = ["decode-0", "decode-1"] }}]

[workload]
num_requests = 30
prompt_len = "uniform:32:256"
output_len = "uniform:8:48"

[load]
kind = "open"
rates = [2.0, 8.0]

[slo]
targets = "ttft=2000ms,tpot=200ms"
"""


def test_calibrate_a_real_engine_then_simulate(
    tmp_path: Path, model_factory: Callable[..., Path]
) -> None:
    model = model_factory("plan-cal", max_position_embeddings=4096)
    out = tmp_path / "tiny.json"
    assert (
        main(
            [
                "plan",
                "calibrate",
                "engine",
                "--model",
                str(model),
                "--quick",
                "--name",
                "tiny-cpu",
                "--out",
                str(out),
                "--transfer",
                "tcp:65536:0.0005",
                "--transfer",
                "tcp:16777216:0.006",
                "--num-kv-blocks",
                "512",
            ]
        )
        == 0
    )
    p = load_profile(out)
    assert p.name == "tiny-cpu" and p.model.block_size == 16
    assert p.model.kv_bytes_per_token > 0 and p.step.base_s > 0
    labels = [s.label for s in p.step_samples]
    assert any(x.startswith("prefill") for x in labels)
    assert any(x.startswith("decode") for x in labels)
    assert all(s.seconds > 0 and s.shape.num_tokens > 0 for s in p.step_samples)
    assert p.swap_samples and p.swap.per_block_s >= 0
    assert p.step.fit["num_points"] == len(p.step_samples)
    assert p.transfer["tcp"].bytes_per_s > 0
    cfg = tmp_path / "sim.toml"
    cfg.write_text(CONFIG.format(profile=out))
    assert main(["plan", "simulate", str(cfg), "--out", str(tmp_path / "sim")]) == 0
    data = json.loads((tmp_path / "sim" / "results.json").read_text())
    recs = [RequestRecord.from_json(r) for r in data["points"][0]["records"]]
    assert len(recs) == 30 and all(r.status == "ok" for r in recs)
    assert all(len(r.itl_s) == r.num_output_tokens - 1 for r in recs)
    for png in ("latency_vs_load.png", "pools_over_time.png"):
        assert (tmp_path / "sim" / png).stat().st_size > 1000


def test_search_writes_helm_values(tmp_path: Path) -> None:
    profile = tmp_path / "test-cpu.json"
    save_profile(make_profile(), profile)
    cfg = tmp_path / "sim.toml"
    cfg.write_text(
        CONFIG.format(profile=profile).replace(
            '[placement]\ngroups = [{ cores = 1, workers = ["decode-0", "decode-1"] }]\n', ""
        )
    )
    values = tmp_path / "values.yaml"
    assert (
        main(
            [
                "plan",
                "search",
                str(cfg),
                "--workers",
                "3",
                "--helm-values",
                str(values),
                "--json",
                str(tmp_path / "all.json"),
            ]
        )
        == 0
    )
    v = yaml.safe_load(values.read_text())
    assert v["prefill"]["replicas"] + v["decode"]["replicas"] == 3
    rows = json.loads((tmp_path / "all.json").read_text())
    assert {r["mode"] for r in rows} == {"disaggregated", "colocated"}
    assert main(["plan", "search", str(cfg), "--workers", "1"]) == 2  # a clear error
