"""Prints the token ids of a text as a JSON list, to check a tokenizer by hand.

    python -m moe.data.tokenize "Hello world"            ->  [15496, 995]
    python -m moe.data.tokenize --tokenizer=byte "Hi"    ->  [72, 105]
    echo "text" | python -m moe.data.tokenize -           (reads standard input)
"""

from __future__ import annotations

import json
import sys

from moe.data.recipe import TOKENIZERS
from moe.data.errors import DataError
from moe.data.tokenizer import get_tokenizer
from cachesim.cli_util import CLI, error, stop_on_interrupt


COMMAND = CLI("python -m moe.data.tokenize", (__doc__ or "").split("\n\n")[0], positional="TEXT",
              positional_help='the text to encode ("-" reads standard input)')
COMMAND.define("enum", "tokenizer", "gpt2", "the tokenizer", enum_values=list(TOKENIZERS))


def main(argv: list[str] | None = None) -> int:
    args = COMMAND.parse(argv)
    if len(args.positional) != 1:
        return error('give exactly one TEXT to encode (quote it; "-" reads standard input)')
    text = sys.stdin.read() if args.positional[0] == "-" else args.positional[0]
    try:
        ids = get_tokenizer(args.tokenizer).encode(text)
    except DataError as e:
        return error(e)
    print(json.dumps(ids))
    return 0


if __name__ == "__main__":
    sys.exit(stop_on_interrupt(main))
