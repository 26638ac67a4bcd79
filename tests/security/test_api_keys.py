"""API keys without a server: where keys come from, what a request must carry, reloads."""

from __future__ import annotations

from pathlib import Path

import pytest

from router.auth import DEFAULT_EXEMPT, ApiKeys, Authenticator, AuthFailure, ExemptPaths


def test_keys_from_flags_env_and_file_are_all_accepted(tmp_path: Path) -> None:
    f = tmp_path / "keys"
    f.write_text("# comment\n\nfile-key\n  spaced-key  \n")
    keys = ApiKeys.load(["flag-key"], str(f), env="env-a, env-b")
    assert keys is not None and keys.count == 5
    for k in ("flag-key", "env-a", "env-b", "file-key", "spaced-key"):
        assert keys.accepts(k)
    assert not keys.accepts("file") and not keys.accepts("") and not keys.accepts("flag-key ")
    assert ApiKeys.load(None, None, env=None) is None  # authentication off
    assert ApiKeys.load(None, None, env=" , ") is None


def test_bad_key_sources_are_refused_at_start(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="must not be empty"):
        ApiKeys.load(["  "])
    with pytest.raises(ValueError, match="cannot read"):
        ApiKeys.load(None, str(tmp_path / "missing"))
    (tmp_path / "empty").write_text("# nothing\n")
    with pytest.raises(ValueError, match="holds no key"):
        ApiKeys.load(None, str(tmp_path / "empty"))


def test_the_header_decides_and_exempt_paths_are_open() -> None:
    keys = ApiKeys.load(["k1"])
    assert keys is not None
    auth = Authenticator(keys, ExemptPaths.parse(DEFAULT_EXEMPT))
    assert auth.check("/v1/completions", "Bearer k1") is None
    assert auth.check("/v1/completions", "bearer   k1 ") is None
    assert auth.check("/v1/completions", None) is AuthFailure.MISSING
    assert auth.check("/v1/completions", "   ") is AuthFailure.MISSING
    assert auth.check("/v1/completions", "k1") is AuthFailure.MALFORMED
    assert auth.check("/v1/completions", "Basic k1") is AuthFailure.MALFORMED
    assert auth.check("/v1/completions", "Bearer k2") is AuthFailure.INVALID
    assert auth.check("/health", None) is None and auth.check("/metrics", None) is None
    assert auth.check("/grpc.health.v1.Health/Check", None) is None
    assert auth.check("/healthz", None) is AuthFailure.MISSING  # exact, not a prefix
    closed = Authenticator(keys, ExemptPaths.parse([""]))
    assert closed.check("/health", None) is AuthFailure.MISSING
    with pytest.raises(ValueError, match="starting with '/'"):
        ExemptPaths.parse(["health"])


def test_the_key_file_reloads_and_a_broken_one_keeps_the_old_keys(tmp_path: Path) -> None:
    f = tmp_path / "keys"
    f.write_text("old\n")
    keys = ApiKeys.load(["fixed"], str(f))
    assert keys is not None
    assert keys.reload_if_changed() is None  # unchanged
    f.write_text("new-1\nnew-2\n")
    assert keys.reload_if_changed() is True
    assert keys.accepts("new-1") and keys.accepts("fixed") and not keys.accepts("old")
    f.write_text("")
    assert keys.reload_if_changed() is False
    assert keys.reload_if_changed() is None  # a broken file is reported once per change
    assert keys.accepts("new-2")
    f.unlink()
    assert keys.reload() is False and keys.accepts("new-2")
