"""Flags and REAPER_* variables: precedence, defaults, and one-line errors for bad values."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from reaper.cli import build_parser
from reaper.names import compile_netns_patterns
from reaper.options import FindOptions, ReapPolicy
from reaper.podcidr import PodCidrs
from reaper.settings import (
    OPTIONS,
    ReapSettings,
    Settings,
    SettingsError,
    agent_settings_from,
    reap_settings_from,
    settings_from,
    unknown_variables,
    with_pod_cidrs,
)


def parse(*argv: str, env: dict[str, str] | None = None, command: str = "reap") -> tuple[Settings, ReapSettings]:
    args = build_parser().parse_args([command, *argv])
    return settings_from(args, env or {}), reap_settings_from(args, env or {})


def test_defaults() -> None:
    settings, reap = parse()
    assert settings.find.netns_dirs == ("/var/run/netns",) and settings.find.bin_dirs == ("/opt/cni/bin",)
    assert settings.policy.min_age == 600 and settings.policy.confirmations == 2
    assert reap.policy.max_reap == 100 and reap.policy.max_orphan_ratio == 0.5 and not reap.policy.kernel_only


def test_the_lock_wait_has_a_bounded_default_a_variable_and_a_flag() -> None:
    """Every command that takes the lock (scan, reap, run) waits 60s for another reaper's pass by
    default; 0 does not wait."""
    for command in ("scan", "reap", "run"):
        assert parse(command=command)[0].lock_wait == 60
    assert parse(env={"REAPER_LOCK_WAIT": "0"})[0].lock_wait == 0
    assert parse("--lock-wait", "2m", env={"REAPER_LOCK_WAIT": "0"})[0].lock_wait == 120


def test_a_flag_beats_its_variable_and_repeatable_variables_split() -> None:
    env = {"REAPER_MIN_AGE": "1h", "REAPER_NETNS_DIR": "/a:/b", "REAPER_MAX_REAP": "7"}
    settings, reap = parse("--min-age", "90", env=env)
    assert settings.policy.min_age == 90
    assert settings.find.netns_dirs == ("/a", "/b")
    assert reap.policy.max_reap == 7
    settings, _ = parse("--netns-dir", "/c", "--netns-dir", "/c/", env=env)
    assert settings.find.netns_dirs == ("/c",)


def test_netns_patterns_in_their_variable_one_a_line_or_split_on_commas() -> None:
    """A regex may hold a comma ({8,64}): a value holding a newline is one regex a line (the chart
    joins netnsPatterns so); one line is split on ',' as before. Empty pieces are skipped, as a
    separator at an end leaves them for every repeatable variable."""

    def patterns(*argv: str, value: str) -> tuple[str, ...]:
        extra = parse(*argv, env={"REAPER_NETNS_PATTERN": value})[0].find.netns_patterns
        return tuple(p.pattern for p in extra[len(compile_netns_patterns(())) :])

    assert patterns(value="[0-9a-f]{8,64}\npod-.*") == ("[0-9a-f]{8,64}", "pod-.*")
    assert patterns(value="[0-9a-f]{8,64}\n") == ("[0-9a-f]{8,64}",)  # one regex with a comma, alone
    assert patterns(value="\na,b\n\nc\n") == ("a,b", "c")
    assert patterns(value="pod-.*,test-[a-z]+,") == ("pod-.*", "test-[a-z]+")  # one line: as operators set it
    # A flag is one regex whatever it holds, and beats the variable.
    assert patterns("--netns-pattern", "x{1,2}", value="a\nb") == ("x{1,2}",)
    # Only this variable takes lines: a newline in a dir is not read as a second one.
    assert parse(env={"REAPER_NETNS_DIR": "/a\n/b"})[0].find.netns_dirs == ("/a\n/b",)


def test_the_settings_hold_the_look_s_options_whole() -> None:
    """The flags make one FindOptions, which the look is given as it is: no field of the
    settings repeats one of its parts (a copy that could be updated without the other)."""
    dirs = ("--netns-dir", "/n", "--ipam-dir", "/i", "--cni-cache-dir", "/c", "--cni-conf-dir", "/f")
    settings, _ = parse(*dirs, "--cni-bin-dir", "/b", "--netns-pattern", "pod-.*", "--namespaces-dir", "/ns")
    assert settings.find == FindOptions(
        netns_dirs=("/n",),
        ipam_dirs=("/i",),
        cache_dir="/c",
        conf_dir="/f",
        bin_dirs=("/b",),
        netns_patterns=compile_netns_patterns(("pod-.*",)),
        namespaces_dirs=("/ns",),
    )
    parts = set(FindOptions.__struct_fields__) | {"conf_dirs"}
    assert not set(dir(settings)) & (parts | {f"cni_{name}" for name in parts})


def test_the_pod_cidrs_learnt_go_into_the_look_s_options() -> None:
    settings, _ = parse("--pod-cidr", "10.244.3.0/24")
    assert settings.find.pod_cidrs is None
    learnt = with_pod_cidrs(settings, {})
    assert learnt.find.pod_cidrs == PodCidrs("10.244.3.0/24", None, "--pod-cidr")
    assert learnt.find.netns_dirs == settings.find.netns_dirs


def test_the_reap_settings_hold_the_plan_s_policy_whole() -> None:
    """The plan is given the ReapPolicy the flags made, and the quarantine it plans for is the
    dir acting moves files to: one field, never a flag and a copy that could disagree."""
    argv = ("--max-reap", "7", "--max-orphan-ratio", "0.2", "--method", "kernel", "--quarantine-dir", "/q")
    _, reap = parse(*argv, "--force")
    assert reap.policy == ReapPolicy(
        max_reap=7, max_orphan_ratio=0.2, kernel_only=True, quarantine_dir="/q", force=True
    )
    assert reap.policy.quarantine
    assert not parse()[1].policy.quarantine
    assert not set(dir(reap)) & {*ReapPolicy.__struct_fields__, "quarantine"}


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--min-age", "ten"], "--min-age='ten': not a duration: use seconds (90) or numbers with a unit"),
        (["--min-age", "-5"], "--min-age='-5': must not be negative"),
        (["--confirmations", "0"], "--confirmations='0': must be 1 or more"),
        (["--confirmations", "x"], "--confirmations='x': not a whole number"),
        (["--netns-dir", "relative"], "--netns-dir='relative': must be an absolute path"),
        (["--runtime-endpoint", "tcp://1.2.3.4"], "--runtime-endpoint='tcp://1.2.3.4': must look like unix:///"),
        (["--netns-pattern", "("], "--netns-pattern='(': invalid regex"),
        (["--max-orphan-ratio", "2"], "--max-orphan-ratio='2': must be between 0 and 1"),
        (["--method", "nuke"], "--method='nuke': must be auto or kernel"),
        (["--log-format", "xml"], "--log-format='xml': must be text or json"),
        (["--lock-wait=-1s"], "--lock-wait='-1s': must not be negative"),
    ],
)
def test_bad_values_are_one_line_errors(argv: list[str], message: str) -> None:
    with pytest.raises(SettingsError) as err:
        parse(*argv)
    assert str(err.value).startswith(message) and "\n" not in str(err.value)


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"REAPER_MIN_AGE": "-5"}, "REAPER_MIN_AGE='-5': must not be negative"),
        ({"REAPER_RUNTIME_TIMEOUT": "0"}, "REAPER_RUNTIME_TIMEOUT='0': must be more than 0"),
        ({"REAPER_STUCK_AFTER": "1h30"}, "REAPER_STUCK_AFTER='1h30': not a duration"),
        # The one item of a list that is wrong, not the whole variable.
        ({"REAPER_NETNS_DIR": "/a:relative"}, "REAPER_NETNS_DIR='relative': must be an absolute path"),
        ({"REAPER_NETNS_PATTERN": "ok-.*\n(\nfine"}, "REAPER_NETNS_PATTERN='(': invalid regex"),
        ({"REAPER_MAX_REAP": "lots"}, "REAPER_MAX_REAP='lots': not a whole number"),
    ],
)
def test_a_bad_variable_is_named_with_its_value(env: dict[str, str], message: str) -> None:
    with pytest.raises(SettingsError) as err:
        parse(env=env)
    assert str(err.value).startswith(message) and "\n" not in str(err.value), err.value


def test_a_long_bad_value_is_cut_short_in_its_error_line() -> None:
    with pytest.raises(SettingsError) as err:
        parse(env={"REAPER_NETNS_DIR": "x" * 5000})
    assert len(str(err.value)) < 200 and str(err.value).startswith("REAPER_NETNS_DIR='xxx")


def test_compound_durations_from_a_flag_and_a_variable() -> None:
    settings, _ = parse("--min-age", "1h30m", env={"REAPER_STUCK_AFTER": "2m30s"})
    assert settings.policy.min_age == 5400 and settings.policy.stuck_after == 150


def test_agent_settings() -> None:
    args = build_parser().parse_args(["run", "--listen", "[::1]:9000", "--interval", "5m"])
    agent = agent_settings_from(args, {})
    assert (agent.mode, agent.interval, agent.listen_host, agent.listen_port) == ("scan", 300, "::1", 9000)
    args = build_parser().parse_args(["run"])
    assert agent_settings_from(args, {"REAPER_MODE": "reap"}).mode == "reap"


def test_a_dir_given_that_is_not_there_is_a_problem(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("")
    env = {"REAPER_IPAM_DIR": f"{tmp_path}:{tmp_path}/gone", "REAPER_CNI_CACHE_DIR": f"{tmp_path}/file"}
    settings, _ = parse("--netns-dir", f"{tmp_path}/typo", "--cni-conf-dir", str(tmp_path), env=env)
    assert settings.given_problems == (
        f"--netns-dir {tmp_path}/typo: no such directory; nothing is found there",
        f"REAPER_IPAM_DIR {tmp_path}/gone: no such directory; nothing is found there",
        f"REAPER_CNI_CACHE_DIR {tmp_path}/file: not a directory; nothing is found there",
    )


def test_a_default_dir_that_is_not_there_is_no_problem() -> None:
    # A node without host-local or a cache yet: nothing was mistyped.
    settings, _ = parse()
    assert settings.given_problems == ()


def test_a_variable_nothing_reads_is_a_problem_with_the_likely_name() -> None:
    # A typo left min-age at its default, silently.
    env = {"REAPER_MINAGE": "1h", "REAPER_FOO": "1", "REAPER_CNI_PRESET": "flannel", "OTHER": "x"}
    settings, _ = parse(env=env)
    assert settings.policy.min_age == 600
    assert settings.given_problems == (
        "REAPER_FOO is set but the reaper reads no such variable",
        "REAPER_MINAGE is set but the reaper reads no such variable (did you mean REAPER_MIN_AGE?)",
    )


def test_every_variable_of_the_table_is_read() -> None:
    env = {o.env: o.default or "" for o in OPTIONS if o.env}
    assert unknown_variables(env) == ()


def test_every_variable_the_chart_sets_is_read() -> None:
    # The chart's env names the agent's settings and doctor's presets: none may warn in the pod.
    chart = (Path(__file__).resolve().parents[2] / "charts").rglob("*.yaml")
    names = {name for path in chart for name in re.findall(r"name: (REAPER_[A-Z0-9_]+)", path.read_text())}
    assert names and unknown_variables(dict.fromkeys(names, "x")) == ()
