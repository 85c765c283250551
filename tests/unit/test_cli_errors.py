"""What the operator sees when the command line or the environment is wrong, from the real
`python -m reaper`: one error naming what was typed, with the usage of the command it was typed
for, exit 2, no traceback; and a reader that went away keeps the exit status."""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from reaper.cli import DOCTOR_UNUSED, build_parser


def clean_env(**extra: str) -> dict[str, str]:
    """This process's environment without any REAPER_* variable, plus `extra`."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("REAPER_")}
    return {**env, **extra}


def reaper(*argv: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "reaper", *argv],
        capture_output=True,
        text=True,
        timeout=60,
        env=env or clean_env(),
        check=False,
    )


def quiet_flags(tmp_path: Path) -> list[str]:
    """A scan that decides nothing (its runtime's socket does not exist) and reads only tmp_path."""
    for name in ("netns", "ipam", "cache", "conf", "bin"):
        (tmp_path / name).mkdir(exist_ok=True)
    return [
        "--netns-dir", str(tmp_path / "netns"),
        "--ipam-dir", str(tmp_path / "ipam"),
        "--cni-cache-dir", str(tmp_path / "cache"),
        "--cni-conf-dir", str(tmp_path / "conf"),
        "--cni-bin-dir", str(tmp_path / "bin"),
        "--runtime-endpoint", f"unix://{tmp_path}/none.sock",
        "--runtime-timeout", "2s",
        "--state-file", str(tmp_path / "state.json"),
    ]  # fmt: skip


def test_an_unknown_top_level_flag_is_named() -> None:
    # argparse said "the following arguments are required: COMMAND" and never named --bogus.
    for argv in (["--bogus"], ["--bogus", "scan"]):
        proc = reaper(*argv)
        assert proc.returncode == 2 and "Traceback" not in proc.stderr
        assert proc.stderr.startswith("usage: reaper [-h]"), proc.stderr
        assert proc.stderr.strip().endswith("reaper: error: unrecognized arguments: --bogus"), proc.stderr


def test_no_command_says_which_there_are() -> None:
    proc = reaper()
    assert proc.returncode == 2 and "a COMMAND is required: scan, reap, run, doctor or explain" in proc.stderr


@pytest.mark.parametrize("command", ["scan", "reap", "run", "doctor"])
def test_an_unknown_flag_of_a_command_prints_that_commands_usage(command: str) -> None:
    proc = reaper(command, "--json" if command != "run" else "--force", "--bogus")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.startswith(f"usage: reaper {command} [-h]"), proc.stderr
    assert proc.stderr.strip().endswith(f"reaper {command}: error: unrecognized arguments: --bogus"), proc.stderr


@pytest.mark.parametrize("flag", DOCTOR_UNUSED)
def test_doctor_refuses_the_flags_it_does_not_use(flag: str) -> None:
    proc = reaper("doctor", f"{flag}=1")
    assert proc.returncode == 2 and proc.stderr.startswith("usage: reaper doctor [-h]"), proc.stderr
    assert proc.stderr.strip().endswith(f"reaper doctor: error: {flag} is not used by doctor: no check reads it")


def test_doctor_keeps_the_flags_its_checks_read() -> None:
    doctor = next(
        a.choices["doctor"] for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)
    ).format_help()
    for flag in ("--netns-dir", "--ipam-dir", "--cni-cache-dir", "--cni-conf-dir", "--cni-bin-dir", "--json"):
        assert flag in doctor
    assert not any(flag in doctor for flag in DOCTOR_UNUSED)


@pytest.mark.parametrize(
    ("env", "line"),
    [
        ({"REAPER_MIN_AGE": "-5"}, "reaper: REAPER_MIN_AGE='-5': must not be negative"),
        ({"REAPER_RUNTIME_TIMEOUT": "soon"}, "reaper: REAPER_RUNTIME_TIMEOUT='soon': not a duration: use seconds"),
        ({"REAPER_CONFIRMATIONS": "0"}, "reaper: REAPER_CONFIRMATIONS='0': must be 1 or more"),
    ],
)
def test_a_bad_variable_is_one_line_naming_it(env: dict[str, str], line: str, tmp_path: Path) -> None:
    proc = reaper("scan", env=clean_env(**env))
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1 and lines[0].startswith(line), proc.stderr


def test_a_flag_beats_a_bad_variable_and_compound_durations_are_taken(tmp_path: Path) -> None:
    proc = reaper("scan", "--json", *quiet_flags(tmp_path), "--min-age", "1h30m", env=clean_env(REAPER_MIN_AGE="-5"))
    assert proc.returncode == 2 and "Traceback" not in proc.stderr  # undecided: no runtime
    assert "REAPER_MIN_AGE" not in proc.stderr and "--min-age" not in proc.stderr


@pytest.mark.parametrize("command", ["scan", "reap", "doctor"])
def test_what_would_do_nothing_is_one_warning_and_a_problem(command: str, tmp_path: Path) -> None:
    flags = quiet_flags(tmp_path)
    if command == "doctor":
        at = flags.index("--state-file")
        del flags[at : at + 2]
    flags[flags.index("--netns-dir") + 1] = f"{tmp_path}/typo"
    at = flags.index("--ipam-dir")  # given by its variable instead
    del flags[at : at + 2]
    env = clean_env(REAPER_IPAM_DIR=f"{tmp_path}/gone", REAPER_MINAGE="1h")
    proc = reaper(command, "--json", *flags, env=env)
    said = [
        f"--netns-dir {tmp_path}/typo: no such directory; nothing is found there",
        f"REAPER_IPAM_DIR {tmp_path}/gone: no such directory; nothing is found there",
        "REAPER_MINAGE is set but the reaper reads no such variable (did you mean REAPER_MIN_AGE?)",
    ]
    warnings = [
        line for line in proc.stderr.splitlines() if line.startswith("warning: ") and "not running as root" not in line
    ]
    assert warnings == [f"warning: {line}" for line in said], proc.stderr
    problems = json.loads(proc.stdout)["layout"]["problems"]
    assert problems[:3] == said


def test_an_endpoint_with_no_socket_is_said_plainly_once_a_stream(tmp_path: Path) -> None:
    proc = reaper("scan", *quiet_flags(tmp_path))
    missing = f"no socket at {tmp_path}/none.sock"
    assert proc.returncode == 2 and "UNAVAILABLE" not in proc.stdout + proc.stderr
    assert proc.stdout.count(missing) == 1, proc.stdout  # its runtime line, not again as the verdict
    assert [line for line in proc.stderr.splitlines() if "cannot decide" in line] == [
        f"reaper: cannot decide: runtime unreachable: {missing}"
    ]


def test_help_says_what_a_duration_may_be() -> None:
    proc = reaper("run", "--help")
    assert proc.returncode == 0
    assert proc.stdout.count("DURATION: seconds (90) or numbers with a unit ms, s, m, h or d") == 1
    assert "1h30m" in proc.stdout


@pytest.mark.parametrize("argv", [["scan"], ["scan", "--json"], ["reap", "--dry-run"], ["reap", "--json"]])
def test_a_closed_stdout_keeps_the_exit_status(argv: list[str], tmp_path: Path) -> None:
    """`reaper scan | head`: the reader gone, the pass still made, its status the same."""
    flags = quiet_flags(tmp_path)
    opened = reaper(*argv, *flags)
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        closed = subprocess.run(
            [sys.executable, "-m", "reaper", *argv, *flags],
            stdout=write_end,
            stderr=subprocess.PIPE,
            text=True,
            timeout=60,
            env=clean_env(),
            check=False,
        )
    finally:
        os.close(write_end)
    assert opened.returncode == 2, opened.stderr  # no runtime: undecided
    assert closed.returncode == opened.returncode, closed.stderr
    assert "Traceback" not in closed.stderr and "BrokenPipe" not in closed.stderr


def test_version_to_a_closed_stdout_is_no_traceback() -> None:
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "reaper", "--version"],
            stdout=write_end,
            stderr=subprocess.PIPE,
            text=True,
            timeout=60,
            env=clean_env(),
            check=False,
        )
    finally:
        os.close(write_end)
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr


YEAR = "more than a year: give at most 365d"
TARGETS_SAID = "give a container ID or a prefix of one (3+ hex digits), a pod NAMESPACE/NAME, an IP address"


@pytest.mark.parametrize(
    ("argv", "env", "line"),
    [
        # Durations past a year: apscheduler's OverflowError, grpc's DEADLINE_EXCEEDED (issue 35).
        (["run", "--interval", "99999999999999999999d"], {}, f"--interval='99999999999999999999d': {YEAR}"),
        (["run"], {"REAPER_INTERVAL": "99999999999999999999d"}, f"REAPER_INTERVAL='99999999999999999999d': {YEAR}"),
        (["scan", "--runtime-timeout", "400d"], {}, f"--runtime-timeout='400d': {YEAR}"),
        (["reap", "--plugin-timeout", "9" * 400], {}, f"--plugin-timeout='{'9' * 80}'...: {YEAR}"),
        (["run", "--stall-after", "8761h"], {}, f"--stall-after='8761h': {YEAR}"),
        (["scan", "--lock-wait", "366d"], {}, f"--lock-wait='366d': {YEAR}"),
        (["scan", "--min-age", "1000d"], {}, f"--min-age='1000d': {YEAR}"),
        (["run", "--interval", "-5"], {}, "--interval='-5': must not be negative"),
        (["scan", "--confirmations", "x"], {}, "--confirmations='x': not a whole number"),
        (["reap", "--max-reap", "-1"], {}, "--max-reap='-1': must be 1 or more"),
        (["run", "--listen", "9753"], {}, "--listen='9753': not HOST:PORT"),
        # explain's target: a usage error, not "nothing matches".
        (["explain", ""], {}, f"explain: TARGET is empty: {TARGETS_SAID}"),
        (["explain", "12"], {}, f"explain: TARGET '12' is too short to name anything: {TARGETS_SAID}"),
        # A directory where a file is written, a file where a directory is made.
        (["scan", "--state-file", "{dir}"], {}, "--state-file='{dir}': is a directory: name a file, like {dir}/FILE"),
        (["scan"], {"REAPER_TEXTFILE": "{dir}"}, "REAPER_TEXTFILE='{dir}': is a directory: name a file"),
        (
            ["scan", "--state-file", "{file}/state.json"],
            {},
            "--state-file='{file}/state.json': {file} is not a directory",
        ),
        (["scan", "--textfile", "{dir}"], {}, "--textfile='{dir}': is a directory: name a file"),
        (["reap", "--dry-run", "--plan-out", "{dir}"], {}, "--plan-out='{dir}': is a directory: name a file"),
        (["reap", "--quarantine-dir", "{file}"], {}, "--quarantine-dir='{file}': is not a directory"),
        # A plan that is not one: said before the pass, never a traceback.
        (["reap", "--plan", "{file}"], {}, "--plan {file}: not JSON"),
        (["reap", "--plan", "{dir}"], {}, "--plan {dir}: not a regular file"),
        (["reap", "--plan", "{dir}/none.json"], {}, "--plan {dir}/none.json: No such file or directory"),
    ],
)
def test_an_operators_mistake_is_one_line_naming_the_flag_and_exit_2(
    argv: list[str], env: dict[str, str], line: str, tmp_path: Path
) -> None:
    """Issue 35: every bad value a command takes is one line on stderr naming what was typed
    and what to give instead, exit 2, no traceback; nothing is looked at or changed first."""
    given = tmp_path / "given"
    given.mkdir()
    (tmp_path / "file").write_text("not json\n")
    places = {"dir": str(given), "file": str(tmp_path / "file")}
    argv = [arg.format(**places) for arg in argv]
    command, rest = argv[0], argv[1:]
    flags = [] if command == "explain" and not rest[0] else quiet_flags(tmp_path)
    proc = reaper(command, *flags, *rest, env=clean_env(**{k: v.format(**places) for k, v in env.items()}))
    said = [x for x in proc.stderr.splitlines() if not x.startswith("warning: not running as root")]
    assert proc.returncode == 2 and len(said) == 1, proc.stderr
    assert said[0].startswith(f"reaper: {line.format(**places)}"), proc.stderr
    assert not (tmp_path / "state.json").exists(), "refused before any pass"
    assert given.is_dir() and not list(given.iterdir()), "the directory is left as it was"


def test_a_metrics_port_in_use_is_one_line_naming_listen_and_the_os_error(tmp_path: Path) -> None:
    """Issue 35: node_exporter on the port crash-looped the agent with AttributeError
    ('_closing'), hiding EADDRINUSE. Now: the flag (or its variable), the error's name, the fix."""
    flags = [*quiet_flags(tmp_path), "--mode", "scan", "--events", "off"]
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        by_flag = reaper("run", *flags, "--listen", f"127.0.0.1:{port}")
        by_variable = reaper("run", *flags, env=clean_env(REAPER_LISTEN=f"127.0.0.1:{port}"))
    why = "Address already in use (EADDRINUSE); another process listens on that port"
    for proc, name in ((by_flag, "--listen"), (by_variable, "REAPER_LISTEN")):
        said = [line for line in proc.stderr.splitlines() if line.startswith("reaper:")]
        assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
        assert said == [f"reaper: {name} 127.0.0.1:{port}: cannot listen: {why} (node_exporter's is 9100): "
                        "give a free port"], proc.stderr  # fmt: skip
    assert not (tmp_path / "state.json").exists(), "no pass before the endpoints listen"
