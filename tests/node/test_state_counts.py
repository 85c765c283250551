"""Confirmation counts and the state file others may rewrite, over whole passes in a scratch
netns: a one-shot's count carried from the file stands for at most `confirmations - 1` passes,
and the agent counts from what it saved itself, whatever the file says in between."""

from __future__ import annotations

from pathlib import Path

from tests.harness.probe import run_probe
from tests.harness.probes import forged_counts, planted_netns


def test_a_forged_count_costs_a_one_shot_at_most_all_but_one_pass_and_the_agent_none(tmp_path: Path) -> None:
    out = run_probe(forged_counts, str(tmp_path))
    assert out["fresh"] == ["pending", "no owner on 1 of 3 required passes"]
    # One-shot: the file is its only memory; a raised count stands for two passes, never three.
    assert out["one_shot_after_forgery"][0] == "orphan"
    assert out["saved_count"] == 3, "what a pass saves is never above the confirmations"
    # The agent: after its first pass it counts its own passes, whatever the file says.
    assert out["agent_first"] == ["pending", "no owner on 1 of 3 required passes"]
    assert out["agent_second"] == ["pending", "no owner on 2 of 3 required passes"]
    assert out["agent_third"][0] == "orphan"


def test_a_netns_planted_in_the_state_file_never_stands_for_the_runtimes_answer(tmp_path: Path) -> None:
    """The state file holds no runtime's answer: a `sandbox_netns` entry a writer of the state
    dir plants for a listed sandbox (older versions kept that map there) is never used. Every
    one-shot asks the runtime's PodSandboxStatus; the agent asks once per sandbox and remembers
    the answer in memory, whatever the file says between its passes."""
    out = run_probe(planted_netns, str(tmp_path))
    assert out["one_shot"] == ["/run/netns/cni-web", 1], "the runtime is asked, the planted path unused"
    assert out["one_shot_again"] == ["/run/netns/cni-web", 2], "a one-shot remembers nothing from the file"
    assert out["agent_first"] == ["/run/netns/cni-web", 3]
    assert out["agent_second"] == ["/run/netns/cni-web", 3], "the agent's own memory answers, not the file"
    assert "sandbox_netns" not in out["saved_keys"]
