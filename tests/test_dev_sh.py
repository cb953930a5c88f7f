"""`bash dev.sh`: its help, and a wrong command as one line naming it, exit 2 (before any set-up)."""

from __future__ import annotations

import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def dev_sh(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(REPO / "dev.sh"), *args], capture_output=True, text=True, timeout=60)


def test_help_names_the_three_commands():
    for flag in ("--help", "-h", "help"):
        run = dev_sh(flag)
        assert run.returncode == 0 and run.stderr == "", (flag, run.stderr)
        assert run.stdout.startswith("usage: bash dev.sh {demo|test|setup}")
        assert all(f"\n  {name} " in run.stdout for name in ("demo", "test", "setup"))


def test_a_wrong_or_missing_command_is_one_line_exit_2():
    run = dev_sh("dmeo")
    assert run.returncode == 2 and run.stdout == ""
    assert run.stderr == "dev.sh: unknown command 'dmeo': allowed demo, test, setup (bash dev.sh --help)\n"
    run = dev_sh()
    assert run.returncode == 2 and run.stderr.count("\n") == 1 and "no command given" in run.stderr
