"""Deprecated name of launch.console (kept one release): console scripts installed before the rename point here."""

import sys

from launch.console import main

if __name__ == "__main__":
    print("warning: python -m launch.cli is deprecated; use cacheable-moe (or python -m launch.console)", file=sys.stderr)
    sys.exit(main())
