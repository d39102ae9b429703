"""The probes of issue 47 this file owns, replayed: each ends in one line and its exit code, never a traceback."""

import subprocess
import sys

from cachesim import cli_util
from helpers import REPO


def test_ctrl_c_in_a_command_is_one_line_and_exit_130(capsys):
    def body(argv):
        raise KeyboardInterrupt

    assert cli_util.run(body, []) == cli_util.INTERRUPTED == 130
    assert capsys.readouterr().err.strip() == cli_util.INTERRUPTED_LINE


def test_ctrl_c_in_an_analysis_command_is_one_line_and_exit_130(capsys):
    from analysis import run_args

    def body(argv):
        raise KeyboardInterrupt

    assert run_args.run_main(body, []) == 130
    assert capsys.readouterr().err.strip() == cli_util.INTERRUPTED_LINE


def test_sigint_while_computing_leaves_no_partial_out(tmp_path):
    # A real SIGINT in a fresh process, after --out was checked and before it was written.
    out = tmp_path / "result.json"
    body = ("import signal, sys\n"
            "from cachesim import cli_util\n"
            "def body():\n"
            "    cli_util.check_writable(sys.argv[1])\n"
            "    signal.raise_signal(signal.SIGINT)\n"
            "    cli_util.write_output('{}', sys.argv[1])\n"
            "sys.exit(cli_util.stop_on_interrupt(body))\n")
    proc = subprocess.run([sys.executable, "-c", body, str(out)], cwd=REPO, capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 130, proc.stderr
    assert proc.stderr.strip() == cli_util.INTERRUPTED_LINE and "Traceback" not in proc.stderr
    assert list(tmp_path.iterdir()) == []
