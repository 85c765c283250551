"""Running a node tool (iptables-save, nft, ...): no shell, bounded in time, failures as data."""

from __future__ import annotations

import subprocess

from msgspec import Struct

EXIT_TIMED_OUT = 124  # as timeout(1) reports it
EXIT_NOT_RUN = 127  # as a shell reports a command it could not start


class CommandResult(Struct, frozen=True):
    code: int
    stdout: str
    stderr: str

    @property
    def last_error_line(self) -> str:
        """The last line of stderr, or the exit status when it printed nothing."""
        lines = self.stderr.strip().splitlines()
        return lines[-1] if lines else f"exit {self.code}"


def run_command(argv: list[str], timeout: float, input_text: str | None = None) -> CommandResult:
    try:
        proc = subprocess.run(
            argv, input=input_text, capture_output=True, text=True, errors="replace", timeout=timeout, check=False
        )  # a comment or name in another encoding is replaced, never a failed pass
    except subprocess.TimeoutExpired:
        return CommandResult(EXIT_TIMED_OUT, "", f"{argv[0]} timed out after {timeout:g}s")
    except OSError as err:
        return CommandResult(EXIT_NOT_RUN, "", f"{argv[0]}: {err.strerror}")
    return CommandResult(proc.returncode, proc.stdout, proc.stderr)
