"""The study's configs: one ml_collections file per arm (``get_config(arg)``, ``sweep(arg)``); pure data.

A config is named by its file's path (``configs/arm_b.py:smoke``), as
ml_collections' ``config_flags`` expects, or — from any directory, e.g. after
``pip install .`` — by the name of one of these files (``arm_b:smoke``,
``arm_b.py:smoke``): :func:`locate` turns such a name into the installed file.
"""

from __future__ import annotations

import pathlib
import re

PACKAGE_DIR = pathlib.Path(__file__).resolve().parent


def names() -> list[str]:
    """The package's configs (files with a ``get_config``): arm_a, arm_b, ..."""
    return sorted(p.stem for p in PACKAGE_DIR.glob("*.py")
                  if re.search(r"^def get_config\(", p.read_text(encoding="utf-8"), re.MULTILINE))


def locate(spec: str) -> str:
    """``path[:arg]`` of a config: the path as given when it exists, else the package's file of that name.

    Neither: a ConfigError naming the config files there are.
    """
    path, sep, arg = spec.partition(":")
    if pathlib.Path(path).is_file():
        return spec
    name = pathlib.Path(path).name
    candidate = PACKAGE_DIR / (name if name.endswith(".py") else f"{name}.py")
    if name and candidate.is_file() and candidate.stem in names():
        return f"{candidate}{sep}{arg}"
    from configs.base import ConfigError
    raise ConfigError(f"--config={spec}: no config file {path!r}; use one of {', '.join(names())} "
                      "(e.g. --config=arm_b:smoke) or the path of a config file")


def locate_in_argv(argv: list[str]) -> list[str]:
    """``argv`` with the value of ``--config`` (``--config=X`` or ``--config X``) located."""
    out = list(argv)
    for i, arg in enumerate(out):
        if arg.startswith("--config="):
            out[i] = "--config=" + locate(arg[len("--config="):])
        elif arg == "--config" and i + 1 < len(out):
            out[i + 1] = locate(out[i + 1])
    return out


def require_config(value) -> None:
    """``--config`` was given; else a ConfigError naming the configs there are."""
    if value is None:
        from configs.base import ConfigError
        raise ConfigError(f"--config is required: one of {', '.join(names())} (e.g. --config=arm_b:smoke) or the "
                          "path of a config file")


def flag_error(e: BaseException) -> str:
    """One line for an error of the ``--config`` flags (config_flags raises assorted types, chained).

    The line names the key: ``--config.train.tokens=abc: ...`` for a value of
    the wrong type, ``unknown config key ...`` for a key the config lacks; our
    own ConfigErrors (raised while the config file builds) name their fix.
    """
    from absl import flags

    chain = [e]
    while True:
        inner = chain[-1].__cause__ or (None if chain[-1].__suppress_context__ else chain[-1].__context__)
        if inner is None:
            break
        chain.append(inner)
    cause = chain[-1]
    message = " ".join(str(cause).split()) or type(cause).__name__
    if isinstance(cause, (KeyError, AttributeError)):
        key = message.strip(chr(34) + chr(39))
        return f"unknown config key {key!r}: check the --config.x=y override against the config file"
    bad_value = next((x for x in chain if isinstance(x, flags.IllegalFlagValueError)
                      and str(x).startswith("flag --config.")), None)
    if bad_value is not None and not isinstance(cause, flags.Error):
        setting = str(bad_value)[len("flag "):].split(":", 1)[0]  # --config.train.tokens=abc
        key, _, raw = setting.partition("=")
        kind = ("an integer" if "int()" in message else "a number" if "float" in message else
                "true or false" if "bool" in message.lower() else "a value of the key's type")
        return f"{setting}: {raw!r} is not {kind}; give {key} {kind}"
    if isinstance(cause, OSError) and "config file" in message:
        return f"cannot load the --config file: {message}"
    return message


def help_notes() -> list[str]:
    """What the help page of a command with ``--config`` says about naming a config and overriding its keys."""
    return [f"--config names one of {', '.join(names())} (from any directory) or a config file's path, with an "
            "optional :size,key=value argument, e.g. --config=arm_b:smoke,lam=0.05 (configs/base.py lists sizes "
            "and keys)",
            "--config.KEY=VALUE sets any field of the config, e.g. --config.loss.lambda_loc=0.02"]
