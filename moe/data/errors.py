"""Errors of the data layer: each message is one line naming the problem and the fix."""


class DataError(ValueError):
    """A corpus, tokenizer or prepared directory that cannot be used as asked."""


class TokenizerError(DataError):
    """The tokenizer's rank file is missing, corrupt or cannot be fetched."""


class ManifestError(DataError):
    """A prepared directory whose files do not match its MANIFEST.json."""


class SourceError(DataError):
    """A corpus source (hub, local file, stdlib) that cannot provide the documents asked for."""
