import os
import sys

# Before torch loads OpenMP (see pdserve/__init__.py).
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

from prefill_service.server import main

sys.exit(main())
