"""``python -m kernels.cpu``: build the compiled CPU kernels into the cache now (or load them if
they are there) and say which ISA and folder; exits 1 when they are unavailable here.
``--quiet``: say nothing when they were already built (a second ``tests/ci/install.sh``
prints nothing); a build, and their absence, are still reported."""

from __future__ import annotations

import logging
import sys

from kernels.cpu import build_key, cache_root, detect_isa, is_built, load


def main(argv: list[str]) -> int:
    quiet = "--quiet" in argv
    key = build_key(detect_isa())
    built = is_built(key)
    logging.basicConfig(
        level=logging.WARNING if quiet and built else logging.INFO, format="%(message)s"
    )
    ops = load()
    if ops is None:
        print("pdserve CPU kernels: unavailable here (see above); engines use the torch path")
        return 1
    if not (quiet and built):
        print(f"pdserve CPU kernels: {ops.isa()} in {cache_root() / key}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
