"""Entry point of `python -m cachesim` (see cachesim.simulate_cli)."""

import sys

from cachesim.cli_util import stop_on_interrupt
from cachesim.simulate_cli import main

sys.exit(stop_on_interrupt(main))
