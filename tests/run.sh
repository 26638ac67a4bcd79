#!/usr/bin/env bash
# Set up everything the test suite needs on a fresh machine (Python, pip and apt only),
# then run the linters, the type checker and the tests. `.ci/run` calls exactly this.
set -euo pipefail
cd "$(dirname "$0")/.."

export PIP_DISABLE_PIP_VERSION_CHECK=1
# Prometheus and promtool (Debian's package) for tests/observability; CI runs this as root.
if ! command -v prometheus >/dev/null || ! command -v promtool >/dev/null; then
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq prometheus
fi
# The CPU wheel of torch 2.13.0 is on local disk; pinning it first keeps pip from pulling a
# multi-GB CUDA build for any dependency that asks for torch.
python3 -m pip install --quiet "torch==2.13.0"
python3 -m pip install --quiet -e ".[test,ucx]"

python3 -m ruff check .
python3 -m mypy
python3 -m pytest -n 2 -q -p no:cacheprovider "$@"
