"""A node tool's output in any encoding is read, never a failed pass."""

from __future__ import annotations

import sys

from reaper.host.commands import run_command


def test_bytes_that_are_not_utf8_are_replaced() -> None:
    result = run_command([sys.executable, "-c", "import sys; sys.stdout.buffer.write(b'comment \\xff\\xfe')"], 10)
    assert result.code == 0 and result.stdout == "comment \ufffd\ufffd"


def test_a_missing_tool_and_a_slow_one_are_results() -> None:
    assert run_command(["/nonexistent/iptables-save"], 10).code == 127
    slow = run_command([sys.executable, "-c", "import time; time.sleep(5)"], 0.2)
    assert slow.code == 124 and "timed out" in slow.stderr
