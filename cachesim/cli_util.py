"""Shared command-line plumbing: one `error: ...` line on bad input."""

from __future__ import annotations

import argparse
import sys
from typing import NoReturn


class ArgumentParser(argparse.ArgumentParser):
    """argparse, but a usage error is one `error: ...` line and exit status 2."""

    def error(self, message: str) -> NoReturn:
        print(f"error: {message} (see {self.prog} --help)", file=sys.stderr)
        sys.exit(2)


def parse_list(text: str, kind: type, what: str) -> list:
    """Parses a comma-separated list, e.g. '0.125,0.25' -> [0.125, 0.25]."""
    try:
        values = [kind(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{what}: cannot parse {text!r} as a comma-separated "
                                         f"list of {kind.__name__}") from None
    if not values:
        raise argparse.ArgumentTypeError(f"{what}: empty list")
    return values
