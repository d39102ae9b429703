"""Prints the token ids of a text as a JSON list, to check a tokenizer by hand.

    python -m moe.data.tokenize "Hello world"            ->  [15496, 995]
    python -m moe.data.tokenize --tokenizer=byte "Hi"    ->  [72, 105]
    echo "text" | python -m moe.data.tokenize -           (reads standard input)
"""

from __future__ import annotations

import argparse
import json
import sys

from moe.data.config import TOKENIZERS
from moe.data.errors import DataError
from moe.data.tokenizer import get_tokenizer


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m moe.data.tokenize", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("text", help='the text to encode ("-" reads standard input)')
    parser.add_argument("--tokenizer", default="gpt2", choices=TOKENIZERS)
    args = parser.parse_args(argv)
    text = sys.stdin.read() if args.text == "-" else args.text
    try:
        ids = get_tokenizer(args.tokenizer).encode(text)
    except DataError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(json.dumps(ids))
    return 0


if __name__ == "__main__":
    sys.exit(main())
