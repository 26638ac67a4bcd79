"""The run-config file: TOML/JSON in, flags on top, the effective config back out."""

from __future__ import annotations

import json
import math
import tomllib
from pathlib import Path

import pytest

from pdserve.bench.cli import _overrides
from pdserve.bench.config import BenchConfig, load_config, merge, to_toml
from pdserve.bench.load import LoadPoint
from pdserve.cli import build_parser

EXAMPLE = """
[target]
url = "http://127.0.0.1:8000/v1"
api = "chat"
extra_body = {min_tokens = 4}

[workload]
num_requests = 10
prompt_len = "lognormal:100:0.5:400"
seed = 3
shared_prefix_len = 64
shared_prefix_fraction = 1.0

[load]
kind = "open"
rates = [1, 2.5, inf]

[slo]
targets = "ttft=500ms,itl=50ms"

[server]
command = "pdserve serve --colocated --http-port 8000"
info = {dtype = "float32", max_num_seqs = 64}
"""


def test_toml_file_round_trips(tmp_path: Path) -> None:
    f = tmp_path / "run.toml"
    f.write_text(EXAMPLE)
    config = BenchConfig.from_dict(load_config(f))
    config.validate()
    assert config.target.api == "chat" and config.target.extra_body == {"min_tokens": 4}
    assert config.workload.spec().shared_prefix_len == 64
    assert config.load.points() == [
        LoadPoint("open", 1.0),
        LoadPoint("open", 2.5),
        LoadPoint("open", math.inf),
    ]
    assert config.server.info == {"dtype": "float32", "max_num_seqs": 64}
    assert config.workload.output_len == "uniform:16:256"  # the default
    again = BenchConfig.from_dict(tomllib.loads(to_toml(config)))
    assert again == config
    j = tmp_path / "run.json"
    j.write_text(json.dumps(config.to_dict(), default=str).replace('"inf"', "1e999"))
    assert BenchConfig.from_dict(load_config(j)) == config


@pytest.mark.parametrize(
    "tables, match",
    [
        ({"workloads": {}}, "unknown config table"),
        ({"workload": {"num_request": 3}}, "unknown key"),
        ({"workload": {"prompt_len": "gauss:3"}}, "bad length"),
        ({"load": {"kind": "burst"}}, "load.kind"),
        ({"slo": {"targets": "ttft=soon"}}, "bad SLO"),
        ({"target": {"api": "embeddings"}}, "target.api"),
        ({"bursts": {"size": -1}}, "bursts.size"),
        ({"bursts": {"size": 2, "interval_s": 0}}, "interval_s > 0"),
        ({"bursts": {"size": 2, "prompt_len": "lots"}}, "bad length"),
    ],
)
def test_bad_configs_are_refused(tables: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        BenchConfig.from_dict(tables).validate()


def test_flags_override_the_file(tmp_path: Path) -> None:
    base = tomllib.loads(EXAMPLE)
    args = build_parser().parse_args(
        ["bench", "--url", "http://h:9", "--concurrency", "1,4", "--seed", "9", "--no-ignore-eos"]
    )
    config = BenchConfig.from_dict(merge(base, _overrides(args)))
    assert config.target.url == "http://h:9/v1"  # a bare host gets /v1
    assert config.target.api == "chat"  # from the file
    assert config.target.ignore_eos is False
    assert config.workload.seed == 9 and config.workload.num_requests == 10
    assert config.load.points() == [LoadPoint("closed", 1), LoadPoint("closed", 4)]
    both = build_parser().parse_args(["bench", "--concurrency", "2", "--rate", "1"])
    with pytest.raises(ValueError, match="not both"):
        _overrides(both)


def test_dry_run_prints_a_config_that_reruns(capsys: pytest.CaptureFixture[str]) -> None:
    from pdserve.cli import main

    argv = ["bench", "--url", "grpc://127.0.0.1:1", "--rate", "2,inf", "--slo", "ttft=1s"]
    assert main([*argv, "--dry-run"]) == 0
    printed = tomllib.loads(capsys.readouterr().out)
    assert printed["target"]["url"] == "grpc://127.0.0.1:1"
    assert printed["load"]["rates"] == [2.0, math.inf] and printed["slo"]["targets"] == "ttft=1s"
    assert main(["bench", "--prompt-len", "uniform:9:1", "--dry-run"]) == 2


def test_bursts_table_and_flags() -> None:
    assert BenchConfig().bursts.spec() is None  # off by default
    args = build_parser().parse_args(
        ["bench", "--burst-size", "3", "--burst-interval-s", "2.5", "--burst-prompt-len", "777"]
    )
    config = BenchConfig.from_dict(merge({}, _overrides(args)))
    spec = config.bursts.spec()
    assert spec is not None and (spec.size, spec.interval_s, spec.start_s) == (3, 2.5, 1.0)
    assert config.bursts.prompt_len == "777" and config.bursts.output_len == "fixed:1"
    assert BenchConfig.from_dict(tomllib.loads(to_toml(config))) == config
