import sys

from decode_service.server import main

sys.exit(main())
