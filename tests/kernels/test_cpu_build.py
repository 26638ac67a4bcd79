"""Building and loading the compiled CPU kernels: the cache key, the portable (non-AVX) build,
and the fallbacks to the torch path (kernels disabled, no compiler), each in a fresh process
(a process can register the ``pdserve_cpu`` operators only once)."""

from __future__ import annotations

import re
import shutil

import pytest

import kernels.cpu as cpu
from tests.child_python import run_python
from tests.kernels.cpu_ops import cpu_ops


def test_build_key_tracks_sources_flags_isa(tmp_path, monkeypatch):
    keys = {isa: cpu.build_key(isa) for isa in cpu.ISA_FLAGS}
    assert len(set(keys.values())) == len(keys) and all(k.startswith(i) for i, k in keys.items())
    copy = tmp_path / "src"
    shutil.copytree(cpu.SOURCE_DIR, copy, ignore=shutil.ignore_patterns("__pycache__"))
    monkeypatch.setattr(cpu, "SOURCE_DIR", copy)
    assert cpu.build_key("avx2") == keys["avx2"]
    (copy / "vec.h").write_text((copy / "vec.h").read_text() + "\n// edited\n")
    assert cpu.build_key("avx2") != keys["avx2"]


def test_isa_override_is_validated(monkeypatch):
    monkeypatch.setenv(cpu.ISA_ENV, "avx2")
    assert cpu.detect_isa() == "avx2"
    monkeypatch.setenv(cpu.ISA_ENV, "sse9")
    with pytest.raises(ValueError, match="PDSERVE_CPU_ISA"):
        cpu.detect_isa()


def test_kernels_in_use_here():
    """On the project's machines (x86-64 with AVX2) the suite runs the compiled kernels."""
    ops = cpu_ops()
    assert ops.isa() in cpu.ISA_FLAGS


def test_portable_build_matches_reference():
    """The baseline build (4-wide vectors, no AVX): the same sources with other vector widths,
    checked against the references in its own process."""
    cpu_ops()  # a compiler is here (else the other tests already fail)
    result = run_python(
        """
        import torch
        from kernels.cpu import load
        from kernels.reference import paged_attention_reference
        ops = load()
        assert ops is not None and ops.isa() == "default", ops
        torch.manual_seed(0)
        pool = torch.randn(40, 2, 2, 16, 2, 24)
        k_cache, v_cache = pool[:, 1, 0], pool[:, 1, 1]
        tables = torch.randperm(40)[:36].view(3, 12).int()
        qsl = torch.tensor([0, 1, 8, 9], dtype=torch.int32)
        lens = torch.tensor([150, 40, 7], dtype=torch.int32)
        q = torch.randn(9, 6, 24)
        out = torch.empty_like(q)
        for window in (0, 9):
            ops.paged_attention(out, q, k_cache, v_cache, tables, qsl, lens, 0.2, window)
            ref = paged_attention_reference(
                q, k_cache, v_cache, tables, qsl, lens, 0.2, window or None)
            torch.testing.assert_close(out, ref, atol=2e-5, rtol=2e-5)
        x, w, b = torch.randn(11, 70), torch.randn(13, 70), torch.randn(13)
        y = ops.linear(x, ops.pack_linear_weight(w), 13, b)
        torch.testing.assert_close(y, torch.nn.functional.linear(x, w, b), atol=1e-4, rtol=1e-4)
        wb = w.bfloat16().float()  # bf16 panels, 4-wide: the same bits as float32 panels
        y = ops.linear(x, ops.pack_linear_weight(wb), 13, b)
        assert torch.equal(ops.linear(x, ops.pack_linear_weight(wb, True), 13, b), y)
        gu = torch.randn(3, 38)
        torch.testing.assert_close(
            ops.silu_mul(gu), torch.nn.functional.silu(gu[:, :19]) * gu[:, 19:])
        logits = torch.randn(5, 1003)
        logits[1, [7, 700]] = 9.0  # a tie: the first wins
        logits[2, 999] = float("nan")
        assert torch.equal(ops.argmax(logits), logits.argmax(dim=-1))
        print("portable ok")
        """,
        PDSERVE_CPU_ISA="default",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "portable ok" in result.stdout


ENGINE_BACKEND = """
    import logging
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    from engine.attention.selector import get_attention_backend
    from kernels.cpu import load
    import torch
    print("loaded", load() is not None)
    print("backend", get_attention_backend(torch.device("cpu")).name)
"""


def test_disabled_by_env_uses_torch_path():
    result = run_python(ENGINE_BACKEND, PDSERVE_CPU_KERNELS="0")
    assert result.returncode == 0, result.stderr
    assert "loaded False" in result.stdout and "backend torch" in result.stdout


def test_no_compiler_one_log_line_and_torch_path(tmp_path):
    result = run_python(
        ENGINE_BACKEND, CXX=str(tmp_path / "no-such-c++"), PDSERVE_KERNEL_CACHE=str(tmp_path)
    )
    assert result.returncode == 0, result.stderr
    assert "loaded False" in result.stdout and "backend torch" in result.stdout
    warnings = [line for line in result.stderr.splitlines() if line.startswith("WARNING")]
    assert len(warnings) == 1 and "no C++ compiler" in warnings[0], result.stderr


def test_cached_build_loads_without_a_compiler(tmp_path):
    """A machine (or image) with the library already in its cache needs no compiler."""
    cpu_ops()
    result = run_python(ENGINE_BACKEND, CXX=str(tmp_path / "no-such-c++"))
    assert result.returncode == 0, result.stderr
    assert "loaded True" in result.stdout and "backend cpu" in result.stdout


def test_prebuilt_path_is_searched_before_the_cache(tmp_path):
    """An image's kernels, built ahead of time into a read-only folder on
    ``PDSERVE_KERNEL_PATH``: loaded with an empty cache and no compiler, nothing built."""
    cpu_ops()
    key = cpu.build_key(cpu.detect_isa())
    prebuilt = tmp_path / "image" / "kernels"
    shutil.copytree(cpu.cache_root() / key, prebuilt / key)
    for path in (prebuilt / key, prebuilt):
        path.chmod(0o555)
    cache = tmp_path / "cache"
    result = run_python(
        ENGINE_BACKEND,
        CXX=str(tmp_path / "no-such-c++"),
        PDSERVE_KERNEL_CACHE=str(cache),
        PDSERVE_KERNEL_PATH=f"{tmp_path / 'missing'}:{prebuilt}",
    )
    assert result.returncode == 0, result.stderr
    assert "loaded True" in result.stdout and "backend cpu" in result.stdout
    assert "building" not in result.stderr and not cache.exists()


BROKEN_BUILD = """
    import logging, shutil, sys
    from pathlib import Path
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    import kernels.cpu as cpu
    src = Path(sys.argv[1])
    if not src.exists():
        shutil.copytree(cpu.SOURCE_DIR, src, ignore=shutil.ignore_patterns("__pycache__"))
        (src / "vec.h").write_text("#error deliberately broken\\n")
    cpu.SOURCE_DIR = src
    print("loaded", cpu.load() is not None)
"""


def test_failed_build_is_logged_and_not_retried(tmp_path):
    """A build that fails leaves its compiler output in the cache folder and the torch path;
    the next process does not compile the same failing sources again."""
    cpu_ops()
    cache = str(tmp_path / "cache")
    runs = [
        run_python(BROKEN_BUILD, str(tmp_path / "src"), PDSERVE_KERNEL_CACHE=cache)
        for _ in range(2)
    ]
    for r in runs:
        assert r.returncode == 0 and "loaded False" in r.stdout, r.stderr
    logs = list((tmp_path / "cache").glob("*/build-error.log"))
    assert len(logs) == 1 and "deliberately broken" in logs[0].read_text()
    assert "compiler output in" in runs[0].stderr
    assert "failed to build before" in runs[1].stderr and "building" not in runs[1].stderr
    for r in runs:  # one line says so; the compiler output goes to the log, not to stderr
        warnings = [line for line in r.stderr.splitlines() if line.startswith("WARNING")]
        assert len(warnings) == 1 and "torch path" in warnings[0], r.stderr
        assert "deliberately broken" not in r.stderr


def _check_message_args(source: str) -> list[str]:
    """The message arguments of every ``TORCH_CHECK(cond, msg...)`` in ``source``."""
    args: list[str] = []
    for start in (m.end() for m in re.finditer(r"\bTORCH_CHECK\(", source)):
        depth, quoted, current, parts = 1, False, "", []
        for ch in source[start:]:
            if quoted:
                quoted = ch != '"' or current.endswith("\\")
            elif ch == '"':
                quoted = True
            elif ch in "([{":
                depth += 1
            elif ch in ")]}":
                depth -= 1
                if depth == 0:
                    break
            elif ch == "," and depth == 1:
                parts.append(current.strip())
                current = ""
                continue
            current += ch
        parts.append(current.strip())
        args += parts[1:]  # parts[0] is the condition
    return args


def test_check_messages_stream_no_numbers():
    """On the H200 image (torch 2.11+cu130, g++ 13) an integer streamed into a TORCH_CHECK
    message crashed the process in libstdc++'s locale facets instead of raising: every
    message argument is a string literal, a ``const char*`` name, ``std::to_string(...)`` or a
    dtype (c10 streams its name). Checked here, where the crash does not happen."""
    literal = r'^("([^"\\]|\\.)*"\s*)+$'
    allowed = re.compile(rf"{literal}|^name$|^std::to_string\(.*\)$|\.scalar_type\(\)$")
    offenders = []
    seen = 0
    for path in sorted([*cpu.SOURCE_DIR.glob("*.cpp"), *cpu.SOURCE_DIR.glob("*.h")]):
        args = _check_message_args(path.read_text())
        seen += len(args)
        offenders += [f"{path.name}: {arg}" for arg in args if not allowed.search(arg)]
    assert not offenders, offenders
    # The parser sees the messages (a regex that matched nothing would pass vacuously).
    assert seen >= 20
    assert _check_message_args('TORCH_CHECK(a == f(b, c), "n=", n, "!");') == ['"n="', "n", '"!"']
