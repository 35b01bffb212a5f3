"""`python -m server` is `ctxcc`."""

import sys

from server.cli import main

sys.exit(main())
