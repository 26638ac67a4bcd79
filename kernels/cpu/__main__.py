"""``python -m kernels.cpu``: build the compiled CPU kernels into the cache now (or load them if
they are there) and say which ISA and folder; exits 1 when they are unavailable here."""

from __future__ import annotations

import logging
import sys

from kernels.cpu import build_key, cache_root, detect_isa, load


def main() -> int:
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    ops = load()
    if ops is None:
        print("pdserve CPU kernels: unavailable here (see above); engines use the torch path")
        return 1
    print(f"pdserve CPU kernels: {ops.isa()} in {cache_root() / build_key(detect_isa())}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
