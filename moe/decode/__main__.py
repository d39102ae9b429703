"""python -m moe.decode: the offloaded decode's CLI, moe.decode.cli (an entry point, outside the package graph)."""

import sys

from moe.decode.cli import main

if __name__ == "__main__":
    sys.exit(main())
