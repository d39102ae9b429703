"""Puts GPT-2's BPE rank file, SHA-256-verified, into the cache (run by scripts/setup.sh).

    python -m moe.data.fetch_tokenizer [--sdist=PATH]

Order of sources, first that works wins:
  1. the cache already holds a verified file: nothing to do;
  2. the default cache (where setup put it, when $CACHEABLE_MOE_CACHE now names
     another) or tiktoken's own cache (r50k_base.tiktoken, the same bytes)
     holds a verified copy: copy it;
  3. the openai-whisper sdist (pinned version and SHA-256), given with --sdist /
     $CACHEABLE_MOE_WHISPER_SDIST, or downloaded from PyPI with
     ``pip download --no-deps``: its ``whisper/assets/gpt2.tiktoken`` member.
The file is written to a temporary name and renamed, so a killed run never
leaves a partial rank file.
"""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Callable

from moe.data.errors import TokenizerError
from moe.data.tokenizer import GPT2_RANKS_SHA256, gpt2_ranks_path, sha256_bytes, verified_copies
from cachesim.cli_util import CLI, error, stop_on_interrupt
from cachesim.files import file_sha256, write_atomic

WHISPER_VERSION = "20250625"
WHISPER_SDIST_NAME = f"openai_whisper-{WHISPER_VERSION}.tar.gz"
WHISPER_SDIST_SHA256 = "37a91a3921809d9f44748ffc73c0a55c9f366c85a3ef5c2ae0cc09540432eb96"
RANKS_MEMBER = "whisper/assets/gpt2.tiktoken"
SDIST_ENV = "CACHEABLE_MOE_WHISPER_SDIST"
PIP_TIMEOUT_S = 300  # the whole `pip download`, metadata preparation included


def extract_ranks(sdist: pathlib.Path, *, sdist_sha256: str | None = None, ranks_sha256: str | None = None) -> bytes:
    """The verified bytes of ``*/whisper/assets/gpt2.tiktoken`` inside the sdist at ``sdist``.

    The expected digests default to the pinned WHISPER_SDIST_SHA256 and GPT2_RANKS_SHA256.
    """
    sdist_sha256 = sdist_sha256 or WHISPER_SDIST_SHA256
    ranks_sha256 = ranks_sha256 or GPT2_RANKS_SHA256
    digest = file_sha256(sdist)
    if digest != sdist_sha256:
        raise TokenizerError(f"{sdist} has SHA-256 {digest[:16]}..., expected {sdist_sha256[:16]}... "
                             f"(openai-whisper=={WHISPER_VERSION}); delete it and fetch it again")
    try:
        with tarfile.open(sdist, "r:gz") as tar:
            # Read the member's bytes; never extract to disk (no path traversal).
            members = [m for m in tar.getmembers() if m.isfile() and m.name.endswith("/" + RANKS_MEMBER)]
            if len(members) != 1:
                raise TokenizerError(f"{sdist} does not contain exactly one {RANKS_MEMBER}")
            data = tar.extractfile(members[0]).read()
    except tarfile.TarError as e:
        raise TokenizerError(f"{sdist} is not a readable .tar.gz ({e}); delete it and fetch it again") from None
    if sha256_bytes(data) != ranks_sha256:
        raise TokenizerError(f"{RANKS_MEMBER} in {sdist} has SHA-256 {sha256_bytes(data)[:16]}..., "
                             f"expected {ranks_sha256[:16]}...")
    return data


def pip_download_sdist(dest: pathlib.Path) -> pathlib.Path:
    """Downloads the pinned openai-whisper sdist from PyPI into ``dest`` (no dependencies)."""
    # openai-whisper publishes only an sdist, so no --no-binary (which would also
    # build pip's isolated build requirements from source: 3x slower).
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check",
           "--timeout", "30", "--retries", "2", f"openai-whisper=={WHISPER_VERSION}", "-d", str(dest)]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=PIP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise TokenizerError(f"`pip download openai-whisper=={WHISPER_VERSION}` took over {PIP_TIMEOUT_S}s; "
                             f"check access to PyPI, or pass --sdist=PATH to a downloaded {WHISPER_SDIST_NAME}"
                             ) from None
    sdist = dest / WHISPER_SDIST_NAME
    if proc.returncode != 0 or not sdist.is_file():
        last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        raise TokenizerError(f"could not download openai-whisper=={WHISPER_VERSION} from PyPI ({last}); "
                             f"check network access to PyPI, or pass --sdist=PATH to a downloaded "
                             f"{WHISPER_SDIST_NAME}")
    return sdist


def ensure_gpt2_ranks(*, sdist: str | os.PathLike | None = None,
                      log: Callable[[str], None] = lambda msg: None) -> pathlib.Path:
    """Makes the verified GPT-2 rank file available at ``gpt2_ranks_path()``; returns that path.

    A quick no-op when it is already there. A corrupt cached copy is replaced.
    """
    target = gpt2_ranks_path()
    if target.is_file():
        if sha256_bytes(target.read_bytes()) == GPT2_RANKS_SHA256:
            return target
        log(f"replacing {target}: its SHA-256 does not match")
    for candidate in verified_copies():
        if candidate.is_file() and sha256_bytes(data := candidate.read_bytes()) == GPT2_RANKS_SHA256:
            write_atomic(target, data)
            log(f"copied GPT-2 ranks from {candidate}")
            return target
    sdist = sdist or os.environ.get(SDIST_ENV)
    if sdist:
        data = extract_ranks(pathlib.Path(sdist))
    else:
        log(f"downloading openai-whisper=={WHISPER_VERSION} sdist from PyPI for GPT-2's BPE ranks ...")
        with tempfile.TemporaryDirectory(prefix="whisper-sdist-") as tmp:
            data = extract_ranks(pip_download_sdist(pathlib.Path(tmp)))
    write_atomic(target, data)
    return target


COMMAND = CLI("python -m moe.data.fetch_tokenizer", (__doc__ or "").split("\n\n")[0])
COMMAND.define("string", "sdist", None, f"a local {WHISPER_SDIST_NAME} to read instead of downloading (SHA-256 checked)")


def main(argv: list[str] | None = None) -> int:
    args = COMMAND.parse(argv)
    try:
        path = ensure_gpt2_ranks(sdist=args.sdist, log=lambda msg: print(f"fetch_tokenizer: {msg}", file=sys.stderr))
    except (TokenizerError, OSError) as e:
        return error(e)
    print(f"GPT-2 BPE ranks ready: {path} (sha256 {GPT2_RANKS_SHA256})")
    return 0


if __name__ == "__main__":
    sys.exit(stop_on_interrupt(main))
