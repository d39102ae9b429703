"""The unit every text source yields."""

from __future__ import annotations

from typing import NamedTuple


class Document(NamedTuple):
    source: str  # where the text came from, e.g. "docstrings:json/decoder.py" or "Salesforce/wikitext#17"
    text: str
