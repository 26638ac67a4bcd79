"""Regenerate the Python code of every ``.proto`` file under ``protos/``.

    python protos/generate.py            # writes *_pb2.py (and *_pb2_grpc.py for services)
    python protos/generate.py --out DIR  # writes into DIR instead (the freshness test uses it)

Paths are rooted at the repository, so a generated module imports its dependencies as
``protos.pdserve.v1.<name>_pb2`` and the committed code works as a normal package.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
PROTOS_DIR = REPO_ROOT / "protos"
_NOQA = "# ruff: noqa\n"


def proto_files() -> list[Path]:
    """Every ``.proto`` file under ``protos/``, sorted."""
    return sorted(PROTOS_DIR.rglob("*.proto"))


def generate(out_dir: Path = REPO_ROOT) -> list[Path]:
    """Run protoc (from grpcio-tools) on every proto file; returns the files it wrote."""
    import grpc_tools
    from grpc_tools import protoc

    include = Path(grpc_tools.__file__).parent / "_proto"
    files = proto_files()
    out_dir.mkdir(parents=True, exist_ok=True)
    args = [
        "grpc_tools.protoc",
        f"-I{REPO_ROOT}",
        f"-I{include}",
        f"--python_out={out_dir}",
        f"--pyi_out={out_dir}",
        f"--grpc_python_out={out_dir}",
        *(str(f.relative_to(REPO_ROOT)) for f in files),
    ]
    if protoc.main(args) != 0:
        raise RuntimeError(f"protoc failed: {' '.join(args)}")
    written: list[Path] = []
    for f in files:
        stem = f.relative_to(REPO_ROOT).with_suffix("")
        for suffix in ("_pb2.py", "_pb2.pyi", "_pb2_grpc.py"):
            path = out_dir / f"{stem}{suffix}"
            if suffix == "_pb2_grpc.py" and path.exists() and "class " not in path.read_text():
                path.unlink()  # no services in this file: grpc stubs would be an empty module
                continue
            if path.exists():
                # Generated code follows protoc's style, not ours (pyproject's ruff exclude
                # only matches top-level protos/*_pb2*.py).
                path.write_text(_NOQA + path.read_text())
                written.append(path)
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=REPO_ROOT, help="output root")
    args = parser.parse_args(argv)
    for path in generate(args.out):
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
