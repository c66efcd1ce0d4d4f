"""``python -m pytest_gpubench.sandbox``: run the sandbox until SIGTERM/SIGINT."""

import sys

from .server import main

sys.exit(main())
