"""The one command-line convention of the project (every CLI, cachesim's and the others', uses it).

* absl flags with lower_snake_case names, one ``FlagValues`` per CLI, so
  several CLIs can be imported and called in one process (tests do).
* Inputs are positional (traces, run directories); options are flags, one
  word per meaning everywhere: ``--capacity`` (fractions of E written with a
  decimal point, or counts: ``0.125,0.25`` or ``4,8``; see
  ``cachesim.policies.parse_capacities``), ``--cache_policy`` (which experts a
  cache keeps), ``--prefetch_policy`` (which transfers prefetch admits),
  ``--layers``, ``--lru_recency``, ``--out`` (checked by
  :func:`check_writable` before computing, written atomically by
  :func:`write_output`), and ``--format`` (one of
  :data:`FORMATS`; each command accepts the subset it can write).
* ``--help`` (or ``-h``) prints the CLI's flags and exits 0.
* Bad input is one ``error: ...`` line on stderr and exit code 2.
* Old spellings (``--capacity-count``, ``--policies``, ``--format=table`` ...)
  keep working as aliases that print one deprecation line.

It lives in cachesim, the lowest package with command lines, because cachesim
is a leaf library and may import nothing of the others; they import this.
absl does the parsing; what is written here is the help page, the
deprecation notes and the error contract, which absl leaves to app.run.
"""

from __future__ import annotations

import difflib
import errno
import os
import pathlib
import shutil
import sys
import types
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NoReturn

from absl import flags

from cachesim.files import write_atomic, write_together

# Exceptions that are the user's input, reported as one line (anything else is a bug: a traceback).
USER_ERRORS: tuple[type[BaseException], ...] = (ValueError, OSError)


# The one --format vocabulary: every command's --format takes the subset of these words it can write.
FORMATS: dict[str, str] = {
    "text": "plain text for a terminal: aligned tables, prose",
    "markdown": "Markdown tables",
    "latex": "LaTeX tables",
    "csv": "comma-separated values",
    "json": "one JSON document",
}
# Old --format words, still accepted with one deprecation line.
FORMAT_ALIASES: dict[str, str] = {"table": "text"}

# Spellings of a help request (absl's too), answered with the command's own help page.
HELP_ARGS = ("-h", "--help", "-help", "--helpshort", "--helpfull", "-?")


class UsageError(ValueError):
    """A malformed command line; the message names the flag and the fix."""


# Set by launch.console before it runs a command's module: the name the user typed (``cacheable-moe simulate``).
invoked_name: str | None = None


def invoked_as(prog: str) -> str:
    """The command's name as the user typed it: ``cacheable-moe simulate`` through the console script, else ``prog``."""
    return invoked_name or prog


def flag_lines(flag_values: flags.FlagValues, names: Sequence[str]) -> list[str]:
    """One help line per flag: ``  --name: help (default: ...)``."""
    lines = []
    for name in names:
        flag = flag_values[name]
        spelled = f"--[no]{name}" if flag.boolean else f"--{name}"
        default = "" if flag.default in (None, "", []) else f" (default: {flag.default_as_str})"
        lines.append(f"  {spelled}: {' '.join(flag.help.split())}{default}")
    return lines


def unknown_flag_line(error: flags.UnrecognizedFlagError, names: Sequence[str], prog: str) -> str:
    """``unknown flag --work_dir; did you mean --workdir?``: suggestions from the command's own flags only
    (absl's would offer its --log_dir for --work_dir)."""
    name = error.flagname
    close = difflib.get_close_matches(name, list(names), n=1, cutoff=0.6)
    hint = f"; did you mean --{close[0]}?" if close else ""
    return f"unknown flag --{name}{hint} (see {prog} --help)"


def check_format(value: str, accepted: Sequence[str], prog: str) -> str:
    """``--format``'s value in the one vocabulary: an old word is translated (one warning), a word ``prog``
    cannot write is refused naming the words it can."""
    if value in FORMAT_ALIASES:
        print(f"warning: --format={value} is deprecated; use --format={FORMAT_ALIASES[value]}", file=sys.stderr)
        value = FORMAT_ALIASES[value]
    if value not in accepted:
        what = "is not one of the project's formats" if value not in FORMATS else f"is not written by {prog}"
        raise UsageError(f"--format={value} {what}; use --format={' or --format='.join(accepted)}")
    return value


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
        self._formats: tuple[str, ...] = ()

    def define(self, kind: str, name: str, default: Any, help: str, **kwargs) -> None:  # noqa: A002
        getattr(flags, f"DEFINE_{kind}")(name=name, default=default, help=help, flag_values=self.flags, **kwargs)
        self._names.append(name)

    def define_format(self, default: str, accepted: Sequence[str]) -> None:
        """``--format``: the subset ``accepted`` of :data:`FORMATS` that this command writes."""
        unknown = [f for f in accepted if f not in FORMATS]
        if unknown or default not in accepted:
            raise ValueError(f"formats {unknown} or default {default!r} outside {list(FORMATS)}")
        self._formats = tuple(accepted)
        old = [f"{word} (deprecated: {new})" for word, new in FORMAT_ALIASES.items() if new in accepted]
        self.define("string", "format", default, "output format: "
                    + ", ".join([*(f"{f} ({FORMATS[f]})" for f in accepted), *old]))

    def deprecated(self, old: str, new: str) -> None:
        """``--old`` does what ``--new`` does, with one line saying so."""
        flags.DEFINE_alias(old, new, flag_values=self.flags)
        self._deprecated[old] = new

    def help_text(self) -> str:
        lines = [f"usage: {invoked_as(self.prog)} [flags]" + (f" {self.positional}" if self.positional else ""), "",
                 self.description.strip(), ""]
        if self.positional:
            lines += [f"  {self.positional}: {self.positional_help}", ""]
        lines += flag_lines(self.flags, self._names)
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
        if any(a in HELP_ARGS for a in args):
            sys.stdout.write(self.help_text())
            sys.exit(0)
        self.flags.unparse_flags()  # a CLI object may be called again (tests)
        try:
            rest = self.flags([self.prog, *args])[1:]
        except flags.UnrecognizedFlagError as e:
            fail(unknown_flag_line(e, [*self._names, *self._deprecated], invoked_as(self.prog)))
        except flags.Error as e:
            fail(f"{e} (see {invoked_as(self.prog)} --help)")
        for old, new in self._deprecated.items():
            if self.flags[old].present:
                print(f"warning: --{old} is deprecated; use --{new}", file=sys.stderr)
        values = {name: self.flags[name].value for name in self._names}
        if self._formats:
            try:
                values["format"] = check_format(values["format"], self._formats, invoked_as(self.prog))
            except UsageError as e:
                fail(str(e))
        return types.SimpleNamespace(positional=rest, **values)

    def present(self, name: str) -> bool:
        """Whether the last parse set ``--name`` (or one of its deprecated spellings)."""
        return bool(self.flags[name].present) or any(
            self.flags[old].present for old, new in self._deprecated.items() if new == name)


def error(message: object) -> int:
    """Prints ``error: message`` on stderr and returns exit code 2: a command's ``return error(e)``."""
    print(f"error: {message}", file=sys.stderr)
    return 2


def fail(message: str) -> NoReturn:
    sys.exit(error(message))


def flags_only(remaining: Sequence[str], prog: str) -> list[str]:
    """absl's leftover argv (the program, then positional arguments), refused in one line when any is left.

    absl apps take flags alone; absl itself would print its whole usage and exit 1.
    """
    if len(remaining) > 1:
        extra = " ".join(remaining[1:])
        fail(f"unexpected argument {extra!r}: {prog} takes only flags (--name=value); see {prog} --help")
    return list(remaining)


def run(main: Callable[[Sequence[str] | None], int], argv: Sequence[str] | None = None, *,
        errors: tuple[type[BaseException], ...] = USER_ERRORS) -> int:
    """Runs a CLI body; the user's bad input becomes one ``error: ...`` line and exit code 2, Ctrl-C exit 130."""
    def body(argv):
        try:
            return main(argv)
        except errors as e:
            return error(os_error_text(e) if isinstance(e, OSError) else e)
    return stop_on_interrupt(body, argv)


# The exit code of a command stopped by Ctrl-C (128 + SIGINT), as a shell reports one killed by it.
INTERRUPTED = 130
INTERRUPTED_LINE = "interrupted (Ctrl-C): stopped; no output file was left half-written"


def stop_on_interrupt(main: Callable[..., int | None], *args, **kwargs) -> int | None:
    """``main(*args, **kwargs)``, with Ctrl-C as one line on stderr and exit code 130 instead of a traceback.

    Output files are written whole or not at all (:func:`write_output`,
    ``moe.rundir.write_atomic``), so stopping anywhere leaves no partial file.
    """
    try:
        return main(*args, **kwargs)
    except KeyboardInterrupt:
        print(f"\n{INTERRUPTED_LINE}", file=sys.stderr, flush=True)
        return INTERRUPTED


def comma_list(text: str, kind: type, what: str) -> list:
    """Parses a comma-separated list, e.g. '0.125,0.25' -> [0.125, 0.25]; UsageError naming ``what``."""
    try:
        values = [kind(part.strip()) for part in str(text).split(",") if part.strip()]
    except ValueError:
        raise UsageError(f"{what}: cannot parse {text!r} as a comma-separated list of {kind.__name__}") from None
    if not values:
        raise UsageError(f"{what}: empty list")
    return values


def check_writable(out: str | None, *, folder: bool = False, flag: str = "--out") -> None:
    """Refuses an ``--out`` that cannot be written, before any computation: one ``error:`` line, exit 2.

    ``folder``: ``out`` is a folder the command writes its files into (made if missing, with its parents).
    """
    if not out:
        return
    problem = _folder_problem(pathlib.Path(out)) if folder else _file_problem(pathlib.Path(out), flag)
    if problem:
        fail(f"{flag}={out} {problem}")


def _file_problem(path: pathlib.Path, flag: str) -> str | None:
    folder = path.parent
    if path.is_dir():
        return "is a directory; give a file path"
    if not folder.is_dir():
        return f"folder {str(folder)!r} does not exist; create it or choose another {flag}"
    if path.exists() and not os.access(path, os.W_OK):
        return f"is read-only; make it writable or choose another {flag}"
    if not os.access(folder, os.W_OK | os.X_OK):
        return f"folder {str(folder)!r} is read-only; choose another {flag}"
    return None


def _folder_problem(path: pathlib.Path) -> str | None:
    if path.exists() and not path.is_dir():
        return "is a file; give a folder"
    existing = next(p for p in (path, *path.parents) if p.exists())  # the folder, or the ancestor it is made in
    if not existing.is_dir():
        return f"cannot be made: {str(existing)!r} is a file; choose another folder"
    if not os.access(existing, os.W_OK | os.X_OK):
        where = "is read-only" if existing == path else f"cannot be made: {str(existing)!r} is read-only"
        return f"{where}; choose another folder"
    return None


def free_space_text(path: str | os.PathLike) -> str:
    """``4,096 bytes free in 'DIR'``: the free space of the filesystem ``path`` (or its nearest folder) is on."""
    path = pathlib.Path(path)
    folder = next((p for p in (path, *path.parents) if p.is_dir()), pathlib.Path("."))
    return f"{shutil.disk_usage(folder).free:,} bytes free in {str(folder)!r}"


def _cause(error: OSError, where: str | os.PathLike) -> str:
    """Why a file operation failed; on a full disk, with the free space where it failed (else at ``where``)."""
    reason = error.strerror or str(error)
    full = error.errno in (errno.ENOSPC, errno.EDQUOT)
    return f"{reason}; {free_space_text(error.filename or where)}" if full else reason


def os_error_text(error: OSError) -> str:
    """A failed file operation as one line: the path, the cause and, on a full disk, the free space there."""
    reason = _cause(error, ".")
    return f"{error.filename}: {reason}" if error.filename else reason


def write_error_line(out: str, error: OSError, flag: str = "--out") -> str:
    """``--out=PATH: cannot write (No space left on device; 4,096 bytes free in 'DIR') ...``; the file that
    failed is named too when ``out`` is a folder."""
    reason = _cause(error, out)
    failed = f" {error.filename}" if error.filename and str(error.filename) != str(out) else ""
    return (f"{flag}={out}: cannot write{failed} ({reason}); the old files, if any, are kept whole; free space "
            f"or choose another {flag}")


def write_output(text: str, out: str | None) -> None:
    """Prints ``text``, or writes it atomically to the file ``--out`` names (then prints the path);
    a failed write is one ``error:`` line and exit 2, leaving any old file whole."""
    if not out:
        print(text)
        return
    try:
        # The user's file: the mode an ordinary open() would give, or the replaced file's.
        write_atomic(out, text if text.endswith("\n") else text + "\n", mode=None)
    except OSError as e:
        fail(write_error_line(out, e))
    print(out)


def write_files(files: Mapping[pathlib.Path, Any], out: str, *, flag: str = "--out") -> None:
    """Writes a command's files into its ``--out`` folder together (cachesim.files.write_together: all or
    none), then names each; a failed write is one ``error:`` line and exit 2, the old files kept whole."""
    try:
        write_together(files, mode=None)
    except OSError as e:
        fail(write_error_line(out, e, flag))
    for path in files:
        print(path)


def app_help(prog: str, description: str, flag_values: flags.FlagValues, names: Sequence[str],
             notes: Sequence[str] = ()) -> str:
    """The help page of an absl app, laid out as :meth:`CLI.help_text` (no module paths, no absl flags)."""
    lines = [f"usage: {prog} [flags]", "", description.strip(), "", *flag_lines(flag_values, names)]
    return "\n".join([*lines, *(["", *notes] if notes else [])]) + "\n"


def own_flag_names(flag_values: flags.FlagValues) -> list[str]:
    """The flags an app defined itself (not absl's --verbosity, --log_dir ...), in definition order."""
    return [f.name for module, defined in flag_values.flags_by_module_dict().items()
            if not module.startswith(("absl", "ml_collections")) for f in defined]


def parse_app_flags(argv: list[str], *, prog: str, description: str, prepare: Callable[[list[str]], list[str]] = list,
                    error_line: Callable[[BaseException], str] = str, notes: Sequence[str] = ()) -> list[str]:
    """``flags_parser`` for absl apps on the global FLAGS
    (``app.run(main, flags_parser=lambda argv: parse_app_flags(argv, prog=..., description=...))``).

    absl's own parser exits 1 after ``--help`` and prints a traceback-like
    block for a bad flag; here ``--help`` prints the app's help page and
    exits 0, and a bad flag or value is one line (``error_line`` of the
    exception; ``prepare`` rewrites argv first and may raise) and exit 2.
    """
    prog = invoked_as(prog)
    if any(a in HELP_ARGS for a in argv[1:]):
        flags.FLAGS.mark_as_parsed()
        sys.stdout.write(app_help(prog, description, flags.FLAGS, own_flag_names(flags.FLAGS), notes))
        sys.exit(0)
    try:
        remaining = flags.FLAGS(prepare(argv))
    except flags.UnrecognizedFlagError as e:
        fail(unknown_flag_line(e, own_flag_names(flags.FLAGS), prog))
    except Exception as e:  # noqa: BLE001 — config_flags raises assorted types
        fail(error_line(e))
    return flags_only(remaining, prog)


class Progress:
    """Counts, rate and ETA of a long job on stderr (rich), silent when stderr is not a terminal (CI, logs).

    ``with progress("simulating", total=12, unit="traces") as bar: ... bar.advance()``;
    ``total=None`` shows a spinner with the count. The one progress display of every CLI and
    of analysis; ``console`` (a rich Console, e.g. a test's) draws there instead of stderr.
    """

    def __init__(self, description: str, total: int | None = None, *, unit: str = "", enabled: bool | None = None,
                 console: Any | None = None):
        self.description, self.total, self.unit, self.console = description, total, unit, console
        isatty = getattr(sys.stderr, "isatty", None)
        self.enabled = (console is not None or bool(isatty and isatty())) if enabled is None else enabled
        self._progress = self._task = None

    def __enter__(self) -> Progress:
        if self.enabled and self.total != 0:
            from rich.console import Console
            from rich import progress as rp

            unit = f" {self.unit}" if self.unit else ""

            class Rate(rp.ProgressColumn):
                def render(self, task):
                    return rp.Text(f"{task.speed:,.1f}{unit}/s" if task.speed else f"?{unit}/s")

            self._progress = rp.Progress(rp.SpinnerColumn(), rp.TextColumn("{task.description}"), rp.BarColumn(),
                                         rp.MofNCompleteColumn(), Rate(), rp.TimeElapsedColumn(),
                                         rp.TextColumn("ETA"), rp.TimeRemainingColumn(),
                                         console=self.console or Console(stderr=True))
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
