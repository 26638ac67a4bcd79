#!/usr/bin/env bash
# Install everything the test suite needs, idempotently: Debian packages (when missing), then
# pdserve's dependencies and the test toolchain at the exact versions of tests/ci/constraints.txt
# (the one known-good set), then pdserve itself in editable mode. A second run installs nothing.
set -euo pipefail
cd "$(dirname "$0")/../.."

export PIP_DISABLE_PIP_VERSION_CHECK=1

# System packages: prometheus + promtool (tests/observability), redis-server (control plane),
# a C++ compiler for the compiled CPU kernels (kernels/cpu; build-essential brings g++), and
# ss (iproute2: tests/faults/test_transfer_faults.py closes KV connections with ss -K).
missing=()
command -v prometheus >/dev/null && command -v promtool >/dev/null || missing+=(prometheus)
command -v redis-server >/dev/null || missing+=(redis-server)
command -v "${CXX:-c++}" >/dev/null || missing+=(build-essential)
command -v ss >/dev/null || missing+=(iproute2)
if [ ${#missing[@]} -gt 0 ]; then
    sudo=""
    [ "$(id -u)" -eq 0 ] || sudo="sudo"
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

# pdserve's requirements (runtime + the test and ucx extras), read from pyproject.toml and
# resolved under the constraints file, so a fresh machine gets exactly the tested versions.
# torch comes first on the list: the constraint picks the local CPU wheel (2.13.0+cpu).
mapfile -t reqs < <(python3 tests/ci/requirements.py test ucx)
python3 -m pip install --quiet -c tests/ci/constraints.txt "${reqs[@]}"

# pdserve itself (editable, no deps: they are installed above). Skipped when this checkout is
# already installed with this pyproject.toml, so a second run is a no-op.
if ! python3 tests/ci/requirements.py --is-installed; then
    python3 -m pip install --quiet --no-deps -e .
    python3 tests/ci/requirements.py --mark-installed
fi

# The compiled CPU kernels, built once into the user's cache (~/.cache/pdserve/kernels, keyed by
# sources, flags, ISA and torch version), so the suite's parallel workers and servers load them
# instead of racing to compile. A no-op when they are already there.
python3 -m kernels.cpu --quiet
