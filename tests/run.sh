#!/usr/bin/env bash
# The README's test command (`.ci/run` calls exactly this): install everything the suite needs
# on a fresh machine (tests/ci/install.sh: apt packages when missing, the pinned toolchain of
# tests/ci/constraints.txt), then ruff (lint and format), mypy and the whole suite. Arguments go
# to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."

bash tests/ci/install.sh

python3 -m ruff check .
python3 -m ruff format --check .
python3 -m mypy
python3 -m pytest -n 2 -q -p no:cacheprovider "$@"
