"""Workload generation: length distributions, seeds, independent random streams, shared prefixes,
cancel points, JSONL prompt files."""

from __future__ import annotations

import json
import random
import statistics
from dataclasses import replace
from pathlib import Path

import pytest

from pdserve.bench.distributions import LengthDist
from pdserve.bench.workload import (
    BenchRequest,
    PromptRenderer,
    WorkloadSpec,
    generate_requests,
)


def spec(**kw: object) -> WorkloadSpec:
    base: dict[str, object] = dict(
        num_requests=400,
        prompt_len=LengthDist.parse("uniform:20:60"),
        output_len=LengthDist.parse("lognormal:32:0.6:200"),
        seed=7,
    )
    base.update(kw)
    return WorkloadSpec(**base)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "text, dist",
    [
        ("fixed:128", LengthDist("fixed", 128)),
        ("128", LengthDist("fixed", 128)),
        ("uniform:32:512", LengthDist("uniform", 32, 512)),
        ("lognormal:128:0.8", LengthDist("lognormal", 128, 0, 0.8)),
        ("lognormal:128:0.8:2048", LengthDist("lognormal", 128, 2048, 0.8)),
    ],
)
def test_parse_round_trips(text: str, dist: LengthDist) -> None:
    assert LengthDist.parse(text) == dist
    assert LengthDist.parse(dist.spec) == dist


@pytest.mark.parametrize(
    "bad", ["", "fixed", "fixed:0", "uniform:10", "uniform:9:3", "lognormal:5", "normal:3:4",
            "lognormal:100:0.5:50", "uniform:a:b"],
)  # fmt: skip
def test_parse_rejects(bad: str) -> None:
    with pytest.raises(ValueError):
        LengthDist.parse(bad)


def test_fixed_and_uniform_stay_in_bounds_and_cover_them() -> None:
    rng = random.Random(0)
    assert {LengthDist.parse("fixed:9").sample(rng) for _ in range(50)} == {9}
    xs = [LengthDist.parse("uniform:3:8").sample(rng) for _ in range(3000)]
    assert set(xs) == set(range(3, 9))
    assert statistics.mean(xs) == pytest.approx(5.5, abs=0.15)


def test_lognormal_median_spread_and_cap() -> None:
    rng = random.Random(1)
    xs = [LengthDist.parse("lognormal:100:0.5").sample(rng) for _ in range(20000)]
    assert statistics.median(xs) == pytest.approx(100, rel=0.03)
    assert statistics.mean(xs) == pytest.approx(
        LengthDist.parse("lognormal:100:0.5").mean, rel=0.03
    )
    capped = [LengthDist.parse("lognormal:100:1.5:150").sample(rng) for _ in range(5000)]
    assert max(capped) == 150 and min(capped) >= 1
    assert all(x >= 1 for x in (LengthDist.parse("lognormal:1:3").sample(rng) for _ in range(500)))


def test_lengths_follow_the_distributions() -> None:
    reqs = generate_requests(spec())
    assert len(reqs) == 400 and [r.index for r in reqs] == list(range(400))
    assert all(20 <= (r.num_prompt_tokens or 0) <= 60 for r in reqs)
    assert all(1 <= r.max_tokens <= 200 for r in reqs)
    assert statistics.median(r.max_tokens for r in reqs) == pytest.approx(32, rel=0.15)
    assert all(r.prompt_text is None and r.cancel_after_tokens is None for r in reqs)
    ids = [t for r in reqs for t in r.prompt_token_ids or ()]
    assert min(ids) >= 10 and max(ids) < 500


def test_same_seed_same_requests_other_seed_differs() -> None:
    assert generate_requests(spec()) == generate_requests(spec())
    other = generate_requests(spec(seed=8))
    assert [r.max_tokens for r in other] != [r.max_tokens for r in generate_requests(spec())]


def test_each_knob_draws_from_its_own_stream() -> None:
    a = generate_requests(spec())
    b = generate_requests(spec(output_len=LengthDist.parse("uniform:1:5")))
    assert [r.prompt_token_ids for r in a] == [r.prompt_token_ids for r in b]
    c = generate_requests(spec(cancel_fraction=0.5))
    assert [(r.prompt_token_ids, r.max_tokens) for r in a] == [
        (r.prompt_token_ids, r.max_tokens) for r in c
    ]


def test_replica_changes_token_ids_only() -> None:
    a, b = generate_requests(spec(), replica=0), generate_requests(spec(), replica=1)
    assert [(r.num_prompt_tokens, r.max_tokens) for r in a] == [
        (r.num_prompt_tokens, r.max_tokens) for r in b
    ]
    assert all(x.prompt_token_ids != y.prompt_token_ids for x, y in zip(a, b, strict=True))


def test_shared_prefix() -> None:
    s = spec(shared_prefix_len=32, shared_prefix_fraction=0.25)
    reqs = generate_requests(s)
    sharing = [r for r in reqs if r.has_shared_prefix]
    assert 0.18 < len(sharing) / len(reqs) < 0.32
    prefix = (sharing[0].prompt_token_ids or ())[:32]
    assert all((r.prompt_token_ids or ())[:32] == prefix for r in sharing)
    assert all((r.prompt_token_ids or ())[:32] != prefix for r in reqs if not r.has_shared_prefix)
    # The total length is the sampled one (at least one token of its own past the prefix) ...
    plain = generate_requests(spec())
    for r, p in zip(reqs, plain, strict=True):
        want = max(p.num_prompt_tokens or 0, 33) if r.has_shared_prefix else p.num_prompt_tokens
        assert r.num_prompt_tokens == want
    # ... and the same prefix in every replica (it is meant to be cached), own tokens differ.
    other = generate_requests(s, replica=3)
    assert all((r.prompt_token_ids or ())[:32] == prefix for r in other if r.has_shared_prefix)
    every = generate_requests(spec(shared_prefix_len=32, shared_prefix_fraction=1.0))
    assert all(r.has_shared_prefix for r in every)


def test_cancel_fraction_and_points() -> None:
    reqs = generate_requests(spec(cancel_fraction=0.3))
    cancelled = [r for r in reqs if r.cancel_after_tokens is not None]
    assert 0.22 < len(cancelled) / len(reqs) < 0.38
    assert all(1 <= (r.cancel_after_tokens or 0) <= max(1, r.max_tokens - 1) for r in cancelled)
    assert all(r.cancel_after_tokens is None for r in generate_requests(spec(cancel_fraction=0)))
    everyone = generate_requests(spec(cancel_fraction=1.0))
    assert all(r.cancel_after_tokens is not None for r in everyone)


def test_spec_validation() -> None:
    for bad in (
        dict(num_requests=0),
        dict(shared_prefix_fraction=1.5),
        dict(cancel_fraction=-0.1),
        dict(token_id_low=5, token_id_high=5),
    ):
        with pytest.raises(ValueError):
            spec(**bad)


def test_jsonl_prompts(tmp_path: Path) -> None:
    f = tmp_path / "p.jsonl"
    rows = [{"prompt": "hello there", "max_tokens": 5}, {"prompt_token_ids": [4, 5, 6]}]
    f.write_text("\n".join(json.dumps(r) for r in rows) + "\n\n")
    reqs = generate_requests(spec(num_requests=5, prompts_file=str(f)))
    assert [r.prompt_text for r in reqs] == ["hello there", None] * 2 + ["hello there"]
    assert reqs[1].prompt_token_ids == (4, 5, 6) and reqs[1].num_prompt_tokens == 3
    assert reqs[0].max_tokens == 5 and 1 <= reqs[1].max_tokens <= 200
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "x"}\n{"text": 1}\n')
    with pytest.raises(ValueError, match=r"bad\.jsonl:2"):
        generate_requests(spec(prompts_file=str(bad)))


def test_renderer_words_and_tokenizer(tokenizer_dir: Path) -> None:
    r = BenchRequest(0, (1, 2, 3, 4), None, 8)
    assert len(PromptRenderer().text(r).split()) == 4
    assert PromptRenderer().text(replace(r, prompt_token_ids=None, prompt_text="hi")) == "hi"
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(tokenizer_dir))
    ids = tok.encode(" the cat sat on the mat", add_special_tokens=False)
    text = PromptRenderer(str(tokenizer_dir)).text(replace(r, prompt_token_ids=tuple(ids)))
    assert text == " the cat sat on the mat"
