"""Entry point of `python -m cachesim` (see cachesim.simulate_cli)."""

import sys

from cachesim.simulate_cli import main

sys.exit(main())
