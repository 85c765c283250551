"""Running a plugin: its output is capped as it is read, and every wait has a deadline."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from reaper.cni.invoke import MAX_OUTPUT, PluginEnv, PluginFailure, run_plugin


def plugin(tmp_path: Path, name: str, script: str) -> PluginEnv:
    path = tmp_path / name
    path.write_text("#!/bin/sh\n" + script)
    path.chmod(0o755)
    return PluginEnv(command="DEL", container_id="c" * 64, netns="", ifname="eth0", args=(), bin_dirs=(str(tmp_path),))


def test_a_plugin_that_prints_without_end_is_killed_at_the_cap(tmp_path: Path) -> None:
    env = plugin(tmp_path, "babbler", "cat >/dev/null; exec yes xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx\n")
    # Killed at the cap, not at the deadline: that one would say "timed out after 30s", the cap's
    # message is made only where the output is read past it.
    with pytest.raises(PluginFailure, match=f"printed more than {MAX_OUTPUT} bytes, killed"):
        run_plugin("babbler", {"cniVersion": "1.0.0"}, env, timeout=30)


def test_a_plugin_that_hangs_is_killed_at_the_deadline(tmp_path: Path) -> None:
    env = plugin(tmp_path, "sleeper", "exec sleep 30\n")
    started = time.monotonic()
    with pytest.raises(PluginFailure, match=r"timed out after 0\.5s, killed"):
        run_plugin("sleeper", {"cniVersion": "1.0.0"}, env, timeout=0.5)
    assert time.monotonic() - started < 5


def test_a_plugin_that_never_reads_its_config_still_answers(tmp_path: Path) -> None:
    env = plugin(tmp_path, "deaf", 'echo \'{"cniVersion": "1.0.0"}\'\n')
    big = {"cniVersion": "1.0.0", "padding": "x" * (4 << 20)}  # more than a pipe holds
    assert run_plugin("deaf", big, env, timeout=10) == {"cniVersion": "1.0.0"}


def test_a_plugin_error_is_its_message(tmp_path: Path) -> None:
    env = plugin(tmp_path, "failing", 'cat >/dev/null; echo \'{"code": 7, "msg": "no such network"}\'; exit 1\n')
    with pytest.raises(PluginFailure, match="failing: no such network") as err:
        run_plugin("failing", {"cniVersion": "1.0.0"}, env, timeout=10)
    assert err.value.code == 7
