"""values.schema.json and values.yaml are what the values model generates; Helm refuses bad
values with the schema's message; every flag value reaches pdserve's parser as that flag."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import helm_python as helm
import pytest
import yaml

from pdserve.chart.__main__ import main as chart_main
from pdserve.chart.flags import CHART_OWNED, Flag, engine_flags, pool_flags, router_flags
from pdserve.chart.values_yaml import default_values
from tests.helm.chart import CHART, containers, lint, objects, render
from tests.helm.cli_args import parse_pdserve_args


def test_generated_files_are_fresh() -> None:
    assert chart_main(["--check"]) == 0, "run python -m pdserve.chart"


def test_values_yaml_holds_the_model_defaults() -> None:
    assert yaml.safe_load((CHART / "values.yaml").read_text()) == default_values()


def test_schema_is_draft_07_and_closed_where_pdserve_owns_the_keys() -> None:
    schema = json.loads((CHART / "values.schema.json").read_text())
    assert schema["$schema"] == "http://json-schema.org/draft-07/schema#"
    assert schema["additionalProperties"] is False
    defs = schema["definitions"]
    for name in ("Router", "Prefill", "Decode", "EngineFlags", "PoolFlags", "Probe", "Redis"):
        assert defs[name]["additionalProperties"] is False, name
    # Kubernetes' own objects and labels pass through open.
    router = defs["Router"]["properties"]
    assert router["resources"]["additionalProperties"] is True
    assert router["podLabels"]["additionalProperties"] == {"type": "string"}


BAD_VALUES = sorted((Path(__file__).parent / "bad_values").glob("*.yaml"))


def _expected(path: Path) -> str:
    """The message a bad values file names in its ``# expect:`` line (the schema's)."""
    (line,) = [x for x in path.read_text().splitlines() if x.startswith("# expect: ")]
    return line.removeprefix("# expect: ")


@pytest.mark.parametrize("path", BAD_VALUES, ids=lambda p: p.stem)
def test_bad_values_files_are_refused_with_the_schema_message(path: Path) -> None:
    values = yaml.safe_load(path.read_text())
    with pytest.raises(helm.HelmValuesError) as refused:
        render(values)
    assert _expected(path) in str(refused.value)
    report = lint(values)  # `helm lint --strict -f <file>` says the same
    assert any(_expected(path) in e for e in report["errors"]), report


def test_there_are_bad_values_files_for_the_cases_the_chart_promises() -> None:
    assert {"typo", "wrong-type", "hpa-and-keda"} <= {p.stem for p in BAD_VALUES}


def test_cpu_autoscaling_needs_a_cpu_request() -> None:
    with pytest.raises(helm.HelmError, match=r"set router.resources.requests.cpu"):
        render({"router": {"autoscaling": {"hpa": {"enabled": True}, "metric": "cpu"}}})


def _sample(flag: Flag) -> Any:
    """A legal non-default value for each kind of flag."""
    if flag.kind == "boolean":
        return True
    if flag.choices:
        return next(c for c in reversed(flag.choices) if c != flag.default)
    return {"integer": 7, "number": 0.75}.get(
        flag.kind, {"--dtype": "float32", "--device": "cpu"}.get(flag.flag, "x")
    )


def _args_of(role: str, values: dict[str, Any]) -> argparse.Namespace:
    (c,) = [c for c in containers(objects(render(values))) if c.role == role and not c.init]
    parsed = parse_pdserve_args(c.spec["args"])
    assert not parsed.unknown
    return parsed.namespace


def _dest(flag: str) -> str:
    return flag.removeprefix("--").replace("-", "_")


def test_every_engine_flag_value_reaches_the_workers_as_that_flag() -> None:
    engine = {f.key: _sample(f) for f in engine_flags()}
    for role in ("prefill", "decode"):
        # null drops the chart default for prefill (Helm deletes a key set to null)
        ns = _args_of(role, {"engine": engine, "prefill": {"flags": {"maxNumBatchedTokens": None}}})
        for f in engine_flags():
            parsed = not engine[f.key] if f.inverted else engine[f.key]
            assert getattr(ns, f.dest) == parsed, f.flag


def test_pool_flags_override_engine_flags() -> None:
    values = {"engine": {"maxNumSeqs": 8}, "decode": {"flags": {"maxNumSeqs": 64}}}
    assert _args_of("decode", values).max_num_seqs == 64
    assert _args_of("prefill", values).max_num_seqs == 8
    assert {f.key for f in pool_flags()} == {f.key for f in engine_flags()} - {
        "blockSize",
        "maxModelLen",
    }


def test_every_router_flag_value_reaches_the_router_as_that_flag() -> None:
    flags = {f.key: _sample(f) for f in router_flags()}
    ns = _args_of(
        "router", {"router": {"flags": flags}, "engine": {"blockSize": 32, "maxModelLen": 256}}
    )
    for f in router_flags():
        assert getattr(ns, _dest(f.flag)) == flags[f.key], f.flag
    assert (ns.block_size, ns.max_model_len) == (32, 256)  # shared with the workers


def test_chart_owned_flags_are_not_values() -> None:
    for flags in (engine_flags(), router_flags()):
        assert not {f.flag for f in flags} & CHART_OWNED


def test_default_workers_run_as_pdserve_serve_runs_them() -> None:
    """The chart's defaults give each worker the engine options `pdserve serve` gives it."""
    from pdserve.cli import build_parser
    from pdserve.options import config_to_argv, engine_config_from_args

    serve = build_parser().parse_args(["serve"])
    common = config_to_argv(engine_config_from_args(serve), exclude=("model",))
    serve_argv = {
        "decode": ["decode", *common],
        "prefill": [
            "prefill",
            *common,
            "--max-num-batched-tokens",
            str(serve.prefill_max_num_batched_tokens),
        ],
    }
    for role, argv in serve_argv.items():
        expected = engine_config_from_args(parse_pdserve_args(argv).namespace)
        assert engine_config_from_args(_args_of(role, {})) == expected, role
