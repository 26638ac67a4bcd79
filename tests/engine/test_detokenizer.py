"""Streaming detokenization never splits a character and never leaks a stop string."""

from __future__ import annotations

from pathlib import Path

import pytest

from engine.detokenizer import IncrementalDetokenizer

TEXT = "Hello café — naïve 東京 and 😀🚀 done. über straße 数据 ✓ π"


@pytest.fixture(scope="module")
def tokenizer(tokenizer_dir: Path):  # type: ignore[no-untyped-def]
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(tokenizer_dir))


def stream(tok, ids: list[int], **kw) -> tuple[list[str], IncrementalDetokenizer]:  # type: ignore[no-untyped-def]
    d = IncrementalDetokenizer(tok, [tok.encode("x")[0]], **kw)
    deltas = []
    for i, t in enumerate(ids):
        d.update([t])
        last = i == len(ids) - 1
        if last or d.stop_string:
            d.flush()
        deltas.append(d.take_new_text(last or d.stop_string is not None))
        if d.stop_string:
            break
    return deltas, d


def test_multibyte_characters_are_never_split(tokenizer) -> None:  # type: ignore[no-untyped-def]
    ids = tokenizer.encode(TEXT)
    # Byte-level BPE really does split some of these characters across tokens.
    assert any("\ufffd" in tokenizer.decode([t]) for t in ids)
    deltas, _ = stream(tokenizer, ids)
    assert all("\ufffd" not in d for d in deltas)
    assert "".join(deltas) == TEXT


def test_stop_string_is_not_leaked_even_when_streamed(tokenizer) -> None:  # type: ignore[no-untyped-def]
    ids = tokenizer.encode(TEXT)
    deltas, d = stream(tokenizer, ids, stop=("東京",))
    assert d.stop_string == "東京"
    assert "".join(deltas) == "Hello café — naïve "
    deltas, d = stream(tokenizer, ids, stop=("東京",), include_stop_str_in_output=True)
    assert "".join(deltas) == "Hello café — naïve 東京"


def test_earliest_of_several_stop_strings_wins(tokenizer) -> None:  # type: ignore[no-untyped-def]
    deltas, d = stream(tokenizer, tokenizer.encode(TEXT), stop=("done", "naï"))
    assert d.stop_string == "naï" and "".join(deltas) == "Hello café — "


@pytest.mark.parametrize("skip", [True, False])
def test_fast_tokenizers_decode_through_rust_with_the_same_text(tokenizer, skip: bool) -> None:  # type: ignore[no-untyped-def]
    """A fast tokenizer's text comes from ``tokenizers.Tokenizer.decode`` directly, with the
    text transformers' ``decode`` gives (special tokens kept or skipped, broken characters),
    and a stream of it is the same as through the wrapper."""
    import random

    from engine.detokenizer import raw_decode

    raw = raw_decode(tokenizer)
    assert raw is not None
    rng = random.Random(3)
    specials = tokenizer.all_special_ids
    for _ in range(200):
        ids = [rng.randrange(tokenizer.vocab_size) for _ in range(rng.randint(0, 9))]
        if specials and rng.random() < 0.3:
            ids.insert(rng.randint(0, len(ids)), rng.choice(specials))
        want = tokenizer.decode(ids, skip_special_tokens=skip, clean_up_tokenization_spaces=False)
        assert raw(ids, skip_special_tokens=skip) == want
    ids = tokenizer.encode(TEXT) + specials[:2] + tokenizer.encode(TEXT)
    fast, _ = stream(tokenizer, ids, skip_special_tokens=skip)

    class Wrapped(type(tokenizer)):  # type: ignore[misc]
        def _decode(self, *args, **kwargs):  # type: ignore[no-untyped-def]
            return super()._decode(*args, **kwargs)

    slow = Wrapped.from_pretrained(tokenizer.name_or_path)
    assert raw_decode(slow) is None  # a class that overrides _decode keeps its own
    wrapped, _ = stream(slow, ids, skip_special_tokens=skip)
    assert fast == wrapped
