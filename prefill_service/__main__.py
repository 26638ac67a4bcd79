import sys

from prefill_service.server import main

sys.exit(main())
