"""Entry point of `python -m cachesim` (see cachesim.cli)."""

import sys

from cachesim.cli import main

sys.exit(main())
