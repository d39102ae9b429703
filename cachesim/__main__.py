"""Entry point of `python -m cachesim` (see cachesim.cli)."""

import sys

from cachesim.cli_util import stop_on_interrupt
from cachesim.cli import main

sys.exit(stop_on_interrupt(main))
