"""python -m moe.decode (see moe.decode.cli)."""

import sys

from moe.decode.cli import main

if __name__ == "__main__":
    sys.exit(main())
