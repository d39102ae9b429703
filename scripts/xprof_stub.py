"""Writes the wheel of a stand-in ``xprof`` for tokamax: ``python scripts/xprof_stub.py DIR``.

tokamax imports one name of xprof (``xprof.cli.tools.get_kernel_stats_tool``,
for its own kernel profiler, which this project never calls) at import time.
The real xprof is a 32 MB wheel that pulls ~40 packages (google-cloud-storage,
duckdb, cryptography, ...): too much for the 64 MiB carried to the offline GPU
machine and for a research venv. This stub satisfies the import and tokamax's
``xprof>=2.23.1`` requirement (as version ``2.24.2+stub``); calling the
profiler raises with the fix. ``pip install xprof==2.24.2`` replaces it.
A wheel is a zip with three metadata files; written here so that no build
backend (and no network) is needed.
"""

from __future__ import annotations

import base64
import hashlib
import pathlib
import sys
import zipfile

NAME, VERSION = "xprof", "2.24.2+stub"
TOOLS = '''def get_kernel_stats_tool(*args, **kwargs):
    raise RuntimeError("xprof here is cacheable-moe's import stub (scripts/xprof_stub.py): "
                       "pip install xprof==2.24.2 for tokamax's kernel profiler")
'''
FILES = {
    "xprof/__init__.py": '"""Import stub of xprof for tokamax (see cacheable-moe scripts/xprof_stub.py)."""\n',
    "xprof/cli/__init__.py": "",
    "xprof/cli/tools.py": TOOLS,
}


def _record_line(path: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{path},sha256={digest},{len(data)}"


def write_wheel(folder: pathlib.Path) -> pathlib.Path:
    dist_info = f"{NAME}-{VERSION}.dist-info"
    files = dict(FILES)
    files[f"{dist_info}/METADATA"] = (f"Metadata-Version: 2.1\nName: {NAME}\nVersion: {VERSION}\n"
                                      "Summary: import stub of xprof for tokamax (cacheable-moe)\n")
    files[f"{dist_info}/WHEEL"] = "Wheel-Version: 1.0\nGenerator: cacheable-moe\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
    record = [_record_line(p, t.encode()) for p, t in files.items()] + [f"{dist_info}/RECORD,,"]
    files[f"{dist_info}/RECORD"] = "\n".join(record) + "\n"
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{NAME}-{VERSION}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as whl:
        for name, text in files.items():
            info = zipfile.ZipInfo(name, date_time=(2020, 1, 1, 0, 0, 0))  # byte-identical rebuilds
            whl.writestr(info, text)
    return path


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python scripts/xprof_stub.py DIR")
    print(write_wheel(pathlib.Path(sys.argv[1])))
