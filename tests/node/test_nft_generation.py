"""The nftables ruleset generation, read from the real kernel, and the agent's use of it: an
`iptables-nft-save` is not run again while the generation it ran at stands, in the same netns.
Each probe runs in a network namespace of its own, with the real iptables tools."""

from __future__ import annotations

import shutil

import pytest

from tests.harness.probe import run_probe

pytestmark = pytest.mark.skipif(not shutil.which("iptables-nft-save"), reason="iptables-nft is not installed")

GENERATIONS = """
import json, subprocess
from reaper.host.nftgen import ruleset_generation
def sh(cmd):
    return subprocess.run(cmd, shell=True, capture_output=True).returncode
seen = {"fresh": ruleset_generation(), "again": ruleset_generation()}
sh("iptables-nft -t nat -N CNI-0123456789abcdef01234567")
seen["chain"] = ruleset_generation()
seen["failed_rc"] = sh("iptables-nft -t nat -D POSTROUTING -j NO-SUCH-CHAIN")
seen["failed"] = ruleset_generation()
sh("iptables-nft-save -t nat")
seen["saved"] = ruleset_generation()
sh("nft add table inet reaper_test")
seen["nft"] = ruleset_generation()
seen["legacy_rc"] = sh("iptables-legacy -t nat -N CNI-LEGACY") if sh("command -v iptables-legacy") == 0 else None
seen["legacy"] = ruleset_generation()
print(json.dumps(seen))
"""


def test_the_generation_moves_with_every_change_to_the_ruleset_and_only_then() -> None:
    seen = run_probe(GENERATIONS)
    assert isinstance(seen["fresh"], int)
    assert seen["again"] == seen["fresh"]
    assert seen["chain"] > seen["fresh"]  # iptables-nft commits through nf_tables
    assert seen["failed_rc"] != 0 and seen["failed"] == seen["chain"]
    assert seen["saved"] == seen["chain"]  # reading changes nothing
    assert seen["nft"] > seen["saved"]
    if seen["legacy_rc"] is not None:
        # Why only the nft backend's saves are ever reused: legacy tables have no generation.
        assert seen["legacy_rc"] == 0 and seen["legacy"] == seen["nft"]


PASSES = """
import ctypes, json, os, shutil, subprocess
from reaper.host.memo import OutputMemo
from reaper.kinds.iptables import SaveCollector, parse_save

CLONE_NEWNET = 0x40000000
memo = OutputMemo()
def sh(cmd):
    subprocess.run(cmd, shell=True, check=True, capture_output=True)
def chains(text, tool):
    return tuple(parse_save(text, tool.family, tool.backend))
def one_pass(with_memo=True):
    collector = SaveCollector("test", "nat", chains, 30.0, memo if with_memo else None)
    ran = sorted(os.path.basename(tool.save) for tool, _ in collector.running)
    results, errors = collector.results()
    memo.end_pass()
    return {"ran": ran, "texts": {os.path.basename(t.save): " ".join(c.chain for c in r) for t, r in results}}

out = {}
sh("iptables-nft -t nat -N CNI-000000000000000000000001")
out["first"] = one_pass()
out["unchanged"] = one_pass()
sh("iptables-nft -t nat -N CNI-000000000000000000000002")
out["changed"] = one_pass()
out["one_shot"] = one_pass(with_memo=False)
legacy = shutil.which("iptables-legacy") is not None
if legacy:
    sh("iptables-legacy -t nat -N CNI-00000000000000000000000a")
    out["legacy_first"] = one_pass()
    sh("iptables-legacy -t nat -N CNI-00000000000000000000000b")
    out["legacy_changed"] = one_pass()
from reaper.host.nftgen import ruleset_generation
out["generation_before"] = ruleset_generation()
# Another netns, brought to the same generation with other rules: the memo must not answer.
assert ctypes.CDLL(None, use_errno=True).unshare(CLONE_NEWNET) == 0, os.strerror(ctypes.get_errno())
n = 0
while ruleset_generation() < out["generation_before"] and n < 100:
    sh(f"iptables-nft -t nat -N CNI-eeeeeeeeeeeeeeeeeeeeee{n:02x}")
    n += 1
out["generation_after"] = ruleset_generation()
out["other_netns"] = one_pass()
print(json.dumps(out))
"""


def test_an_nft_save_is_run_again_only_when_the_generation_or_the_netns_changed() -> None:
    out = run_probe(PASSES)
    first, unchanged, changed = out["first"], out["unchanged"], out["changed"]
    assert "iptables-nft-save" in first["ran"]
    assert "CNI-000000000000000000000001" in first["texts"]["iptables-nft-save"]
    # Nothing changed: not run, last pass's result given.
    assert not any(name.endswith("nft-save") for name in unchanged["ran"])
    assert unchanged["texts"]["iptables-nft-save"] == first["texts"]["iptables-nft-save"]
    # A chain added: run again, and the chain is in what it gives.
    assert "iptables-nft-save" in changed["ran"]
    assert "CNI-000000000000000000000002" in changed["texts"]["iptables-nft-save"]
    # Without a memo it always runs.
    assert "iptables-nft-save" in out["one_shot"]["ran"]
    if "legacy_first" in out:
        # Legacy tables have no generation: their save runs every pass and sees every change.
        assert "iptables-legacy-save" in out["legacy_first"]["ran"]
        assert "iptables-legacy-save" in out["legacy_changed"]["ran"]
        assert "CNI-00000000000000000000000b" in out["legacy_changed"]["texts"]["iptables-legacy-save"]
    # Same generation number, another netns: asked afresh, and only its own rules are seen.
    assert out["generation_after"] == out["generation_before"], "generations differ: proves nothing"
    other = out["other_netns"]
    assert "iptables-nft-save" in other["ran"]
    assert "CNI-000000000000000000000001" not in other["texts"]["iptables-nft-save"]
