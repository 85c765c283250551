"""What `make demo` prints besides the reaper's own output: commands as an operator types them,
and a runtime's errors whole (the demo runs on the lab: `make demo`)."""

from __future__ import annotations

from tests.harness.lab.demo import NO_GRACE, indented, typed


def test_a_command_is_printed_as_typed_on_a_node() -> None:
    assert typed(["scan", "--netns-dir", "/var/run/netns", "--min-age", "0"]) == (
        "reaper scan --netns-dir /var/run/netns --min-age 0"
    )
    assert typed(["scan", "--netns-pattern", "^my ns$"]) == "reaper scan --netns-pattern '^my ns$'"
    assert NO_GRACE == ("--min-age", "0", "--confirmations", "1")


def test_an_error_is_printed_whole_each_line_indented() -> None:
    error = "RunPodSandbox on unix:///x.sock: UNKNOWN: " + "x" * 300 + "\nsecond line"
    shown = indented(error)
    assert shown.splitlines() == ["    RunPodSandbox on unix:///x.sock: UNKNOWN: " + "x" * 300, "    second line"]
    assert indented("") == "    (no error text)"
