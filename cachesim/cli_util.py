"""The one command-line convention of the project (every CLI, cachesim's and the others', uses it).

* absl flags with lower_snake_case names, one ``FlagValues`` per CLI, so
  several CLIs can be imported and called in one process (tests do).
* Inputs are positional (traces, run directories); options are flags:
  ``--capacity`` (fractions of E written with a decimal point, or counts:
  ``0.125,0.25`` or ``4,8``; see ``cachesim.policies.parse_capacities``),
  ``--format`` and ``--out`` mean the same everywhere.
* ``--help`` (or ``-h``) prints the CLI's flags and exits 0.
* Bad input is one ``error: ...`` line on stderr and exit code 2.
* Old spellings (``--capacity-count``, ``--trace``, ``--run`` ...) keep working
  as aliases that print one deprecation line.

It lives in cachesim, the lowest package with command lines, because cachesim
is a leaf library and may import nothing of the others; they import this.
absl does the parsing; what is written here is the help page, the
deprecation notes and the error contract, which absl leaves to app.run.
"""

from __future__ import annotations

import sys
import types
from collections.abc import Callable, Sequence
from typing import Any, NoReturn

from absl import flags

# Exceptions that are the user's input, reported as one line (anything else is a bug: a traceback).
USER_ERRORS: tuple[type[BaseException], ...] = (ValueError, OSError)


class UsageError(ValueError):
    """A malformed command line; the message names the flag and the fix."""


class CLI:
    """One command line: its flags, help page, deprecated aliases and parsing.

    ``define(kind, name, default, help, **kwargs)`` defines a flag with absl's
    ``DEFINE_<kind>`` on this CLI's own ``FlagValues``; ``deprecated(old,
    new)`` keeps an old spelling working; :meth:`parse` returns the positional
    arguments.
    """

    def __init__(self, prog: str, description: str, *, positional: str = "", positional_help: str = ""):
        self.prog, self.description = prog, description
        self.positional, self.positional_help = positional, positional_help
        self.flags = flags.FlagValues()
        self._names: list[str] = []
        self._deprecated: dict[str, str] = {}

    def define(self, kind: str, name: str, default: Any, help: str, **kwargs) -> None:  # noqa: A002
        getattr(flags, f"DEFINE_{kind}")(name=name, default=default, help=help, flag_values=self.flags, **kwargs)
        self._names.append(name)

    def deprecated(self, old: str, new: str) -> None:
        """``--old`` does what ``--new`` does, with one line saying so."""
        flags.DEFINE_alias(old, new, flag_values=self.flags)
        self._deprecated[old] = new

    def help_text(self) -> str:
        lines = [f"usage: {self.prog} [flags]" + (f" {self.positional}" if self.positional else ""), "",
                 self.description.strip(), ""]
        if self.positional:
            lines += [f"  {self.positional}: {self.positional_help}", ""]
        for name in self._names:
            flag = self.flags[name]
            spelled = f"--[no]{name}" if flag.boolean else f"--{name}"
            default = "" if flag.default in (None, "", []) else f" (default: {flag.default_as_str})"
            lines.append(f"  {spelled}: {flag.help}{default}")
        if self._deprecated:
            lines += ["", "deprecated spellings (still accepted): "
                      + ", ".join(f"--{old} -> --{new}" for old, new in self._deprecated.items())]
        return "\n".join(lines) + "\n"

    def parse(self, argv: Sequence[str] | None) -> types.SimpleNamespace:
        """Parses ``argv`` (without the program name; None: ``sys.argv[1:]``).

        Returns every flag's value as an attribute, and the positional
        arguments as ``.positional``. ``--help`` exits 0 after printing the help
        page; a malformed command line exits 2 with one line.
        """
        args = list(sys.argv[1:] if argv is None else argv)
        if any(a in ("-h", "--help", "-help", "--helpfull") for a in args):
            sys.stdout.write(self.help_text())
            sys.exit(0)
        self.flags.unparse_flags()  # a CLI object may be called again (tests)
        try:
            rest = self.flags([self.prog, *args])[1:]
        except flags.Error as e:
            fail(f"{e} (see {self.prog} --help)")
        for old, new in self._deprecated.items():
            if self.flags[old].present:
                print(f"warning: --{old} is deprecated; use --{new}", file=sys.stderr)
        return types.SimpleNamespace(positional=rest, **{name: self.flags[name].value for name in self._names})

    def present(self, name: str) -> bool:
        """Whether the last parse set ``--name`` (or one of its deprecated spellings)."""
        return bool(self.flags[name].present) or any(
            self.flags[old].present for old, new in self._deprecated.items() if new == name)


def fail(message: str) -> NoReturn:
    print(f"error: {message}", file=sys.stderr)
    sys.exit(2)


def run(main: Callable[[Sequence[str] | None], int], argv: Sequence[str] | None = None, *,
        errors: tuple[type[BaseException], ...] = USER_ERRORS) -> int:
    """Runs a CLI body; the user's bad input becomes one ``error: ...`` line and exit code 2."""
    try:
        return main(argv)
    except errors as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


def comma_list(text: str, kind: type, what: str) -> list:
    """Parses a comma-separated list, e.g. '0.125,0.25' -> [0.125, 0.25]; UsageError naming ``what``."""
    try:
        values = [kind(part.strip()) for part in str(text).split(",") if part.strip()]
    except ValueError:
        raise UsageError(f"{what}: cannot parse {text!r} as a comma-separated list of {kind.__name__}") from None
    if not values:
        raise UsageError(f"{what}: empty list")
    return values


def write_output(text: str, out: str | None) -> None:
    """Prints ``text``, or writes it to the file ``--out`` names (then prints the path)."""
    if not out:
        print(text)
        return
    with open(out, "w", encoding="utf-8") as f:
        f.write(text if text.endswith("\n") else text + "\n")
    print(out)


def parse_app_flags(argv: list[str]) -> list[str]:
    """``flags_parser`` for absl apps on the global FLAGS (``app.run(main, flags_parser=parse_app_flags)``).

    absl's own parser exits 1 after ``--help`` and prints a traceback-like
    block for a bad flag; here ``--help`` prints the main module's flags and
    exits 0, and a bad config file, option or override is one line and exit 2.
    """
    if any(a in ("-h", "--help", "-help", "--helpshort", "--helpfull") for a in argv[1:]):
        flags.FLAGS.mark_as_parsed()
        own = [m for m in flags.FLAGS.flags_by_module_dict() if not m.startswith(("absl", "ml_collections"))]
        print(f"usage: {argv[0]} [flags]\n\n" + "\n\n".join(flags.FLAGS.module_help(m) for m in own))
        sys.exit(0)
    try:
        return flags.FLAGS(argv)
    except Exception as e:  # noqa: BLE001 — config_flags raises assorted types
        cause = e
        while cause.__cause__ is not None or cause.__context__ is not None:
            cause = cause.__cause__ or cause.__context__
        message = str(cause) or type(cause).__name__
        if isinstance(cause, (KeyError, AttributeError)):
            message = (f"unknown config key {message.strip(chr(34) + chr(39))!r}: check the --config.x=y "
                       "override against the config file")
        fail(message)


class Progress:
    """Counts, rate and ETA of a long job on stderr (rich), silent when stderr is not a terminal (CI, logs).

    ``with progress("simulating", total=12) as bar: ... bar.advance()``; ``total=None`` shows a
    spinner with the count. Shared by every CLI so that they all look and behave alike.
    """

    def __init__(self, description: str, total: int | None = None, *, enabled: bool | None = None):
        self.description, self.total = description, total
        self.enabled = sys.stderr.isatty() if enabled is None else enabled
        self._progress = self._task = None

    def __enter__(self) -> Progress:
        if self.enabled:
            from rich.console import Console
            from rich import progress as rp

            class Rate(rp.ProgressColumn):
                def render(self, task):
                    return rp.Text(f"{task.speed:,.1f}/s" if task.speed else "")

            self._progress = rp.Progress(rp.SpinnerColumn(), rp.TextColumn("{task.description}"), rp.BarColumn(),
                                         rp.MofNCompleteColumn(), Rate(), rp.TimeElapsedColumn(),
                                         rp.TimeRemainingColumn(), console=Console(stderr=True))
            self._progress.start()
            self._task = self._progress.add_task(self.description, total=self.total)
        return self

    def advance(self, steps: int = 1, description: str | None = None) -> None:
        if self._progress is not None:
            self._progress.update(self._task, advance=steps, **({"description": description} if description else {}))

    def __exit__(self, *exc) -> None:
        if self._progress is not None:
            self._progress.stop()


progress = Progress
