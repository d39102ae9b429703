"""The study's configs: one ml_collections file per arm (``get_config(arg)``, ``sweep(arg)``); pure data.

A config is named by its file's path (``configs/arm_b.py:smoke``), as
ml_collections' ``config_flags`` expects, or — from any directory, e.g. after
``pip install .`` — by the name of one of these files (``arm_b:smoke``,
``arm_b.py:smoke``): :func:`locate` turns such a name into the installed file.
"""

from __future__ import annotations

import pathlib

PACKAGE_DIR = pathlib.Path(__file__).resolve().parent


def locate(spec: str) -> str:
    """``path[:arg]`` of a config: the path as given when it exists, else the package's file of that name."""
    path, sep, arg = spec.partition(":")
    if pathlib.Path(path).is_file():
        return spec
    name = pathlib.Path(path).name
    candidate = PACKAGE_DIR / (name if name.endswith(".py") else f"{name}.py")
    if name and candidate.is_file() and candidate.name != "__init__.py":
        return f"{candidate}{sep}{arg}"
    return spec  # config_flags reports the missing file


def locate_in_argv(argv: list[str]) -> list[str]:
    """``argv`` with the value of ``--config`` (``--config=X`` or ``--config X``) located."""
    out = list(argv)
    for i, arg in enumerate(out):
        if arg.startswith("--config="):
            out[i] = "--config=" + locate(arg[len("--config="):])
        elif arg == "--config" and i + 1 < len(out):
            out[i + 1] = locate(out[i + 1])
    return out
