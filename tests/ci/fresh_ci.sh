#!/usr/bin/env bash
# CI the way a new machine runs it: a throwaway venv first on PATH, a fresh clone of the
# current commit, then `.ci/run` there; then the install step once more, which must change
# nothing. Run it before saying an issue is resolved. Uncommitted changes are NOT tested.
#
#   bash tests/ci/fresh_ci.sh [pytest args...]     # KEEP=1 keeps the temp dir
set -euo pipefail
src=$(git -C "$(dirname "$0")" rev-parse --show-toplevel)
rev=$(git -C "$src" rev-parse HEAD)
if [ -n "$(git -C "$src" status --porcelain --untracked-files=no)" ]; then
    echo "fresh_ci: note: uncommitted changes in $src are not part of this run" >&2
fi
# Not under /tmp: the chart tests' pods mount an emptyDir at /tmp, which would hide a venv
# there from the pods' processes ("pdserve: No such file or directory").
work=$(mktemp -d "${FRESH_CI_DIR:-/var/tmp}/pdserve-fresh-ci.XXXXXX")
chmod 755 "$work"  # mktemp makes it 0700: the chart tests run pods as another user (10001)
[ "${KEEP:-0}" = 1 ] || trap 'rm -rf "$work"' EXIT

python3 -m venv "$work/venv"
export PATH="$work/venv/bin:$PATH"
unset VIRTUAL_ENV PYTHONPATH PYTHONHOME
git clone --quiet --no-hardlinks "$src" "$work/repo"
git -C "$work/repo" checkout --quiet "$rev"
cd "$work/repo"
echo "fresh_ci: commit $rev, venv $work/venv ($(python3 --version)), clone $work/repo"

start=$(date +%s)
CI=true bash .ci/run "$@"
echo "fresh_ci: .ci/run passed in $(( $(date +%s) - start )) s"

python3 -m pip freeze >"$work/before.txt"
again=$(bash tests/ci/install.sh 2>&1)
python3 -m pip freeze >"$work/after.txt"
if ! diff -q "$work/before.txt" "$work/after.txt" >/dev/null || [ -n "$again" ]; then
    echo "fresh_ci: FAILED: a second install changed the environment or said something:" >&2
    diff "$work/before.txt" "$work/after.txt" >&2 || true
    echo "$again" >&2
    exit 1
fi
echo "fresh_ci: a second tests/ci/install.sh was a no-op; pip resolved:"
grep -iE '^(torch|transformers|ruff|mypy|pytest|pytest-xdist|grpcio|grpcio-tools)==' "$work/after.txt" | tr '\n' ' '
echo
