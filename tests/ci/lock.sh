#!/usr/bin/env bash
# Re-resolve the known-good set into tests/ci/constraints.txt: a throwaway venv, pdserve's
# requirements, then `pip freeze`. By default the current pins are kept and only packages that
# are new to pyproject.toml get resolved (the newest that fit); `--upgrade` re-resolves every
# package. Upgrading the toolchain is `lock.sh --upgrade` plus a commit that fixes whatever the
# new tools find.
set -euo pipefail
cd "$(dirname "$0")/../.."
root=$(pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
python3 -m venv "$work/venv"
export PATH="$work/venv/bin:$PATH"
unset VIRTUAL_ENV PYTHONPATH
mapfile -t reqs < <(python3 tests/ci/requirements.py test ucx)
keep=(-c tests/ci/constraints.txt)
[ "${1:-}" = "--upgrade" ] && keep=()
python3 -m pip install --quiet --disable-pip-version-check "${keep[@]}" "${reqs[@]}"
{
    echo "# The one known-good set the test suite runs with: every package, exact versions."
    echo "# Made by tests/ci/lock.sh on $(date -u +%F) with $(python3 --version); tests/ci/install.sh"
    echo "# installs under it (pip -c). Edit by re-running lock.sh, never by hand."
    # --all: setuptools (a runtime dependency: the CPU kernels build with it) is left out of a
    # plain freeze; pip itself is the installer, not a pin.
    python3 -m pip freeze --all --exclude-editable | grep -v '^pip==' |
        sed -E 's/^(torch==[^+]+)\+cpu$/\1/'
} >"$root/tests/ci/constraints.txt"
echo "wrote tests/ci/constraints.txt ($(grep -vc '^#' "$root/tests/ci/constraints.txt") pins)"
