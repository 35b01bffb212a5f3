"""`python -m server` is `ctxcc`."""

import sys

from server.entry import main

sys.exit(main())
