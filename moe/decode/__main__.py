"""python -m moe.decode: the offloaded decode's CLI, moe.decode.cli (an entry point, outside the package graph)."""

import sys

from cachesim.cli_util import stop_on_interrupt
from moe.decode.cli import main

if __name__ == "__main__":
    sys.exit(stop_on_interrupt(main))
