"""The nftables ruleset generation, read from the real kernel, and the agent's use of it: an
`iptables-nft-save` is not run again while the generation it ran at stands, in the same netns.
Each probe runs in a network namespace of its own, with the real iptables tools."""

from __future__ import annotations

import shutil
from pathlib import Path

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


ONE_SHOTS = """
import ctypes, json, os, subprocess, sys, time
from reaper.host.memo import load_memo, save_memo
from reaper.host.nftgen import ruleset_generation
from pathlib import Path
from reaper.kinds import firewall
from reaper.kinds.iptables import ChainCollector, saved_chains
from tests.harness.passes import options_at

CLONE_NEWNET = 0x40000000
libc = ctypes.CDLL(None, use_errno=True)
state_dir = sys.argv[1]
path = os.path.join(state_dir, "state.json.memo")
checks = {"iptables": saved_chains, "firewall": firewall.saved_rules}
def sh(cmd):
    subprocess.run(cmd, shell=True, check=True, capture_output=True)
def one_shot(memo_file=path):
    # As `reaper scan` makes it: the memo read from its file, the look, the memo saved back.
    memo, warning = load_memo(memo_file, checks)
    collector = ChainCollector(options_at(Path(state_dir)), memo.outputs)
    filters = firewall.KIND.start(options_at(Path(state_dir)), memo.outputs)
    ran = sorted(os.path.basename(tool.save) for tool, _ in collector.running)
    ran_filter = sorted(os.path.basename(tool.save) for tool, _ in filters.running)
    chains, errors = collector.chains()
    rules, filter_errors = filters.results()
    memo.end_pass()
    if memo.changed_in(checks):
        save_memo(memo_file, memo, checks)
    names = sorted(c.chain for c in chains)
    return {"ran": ran, "chains": names, "warning": warning, "errors": [e.error for e in errors + filter_errors],
            "ran_filter": ran_filter, "rules": sorted(r.rule for _, parsed in rules for r in parsed)}
def new_netns():
    assert libc.unshare(CLONE_NEWNET) == 0, os.strerror(ctypes.get_errno())
    return os.stat("/proc/self/ns/net").st_ino

out = {}
first_ino = new_netns()
sh("iptables-nft -t nat -N CNI-000000000000000000000001")
sh("iptables-nft -N CNI-FORWARD && iptables-nft -A CNI-FORWARD -s 10.77.0.5/32 -j ACCEPT")
generation = ruleset_generation()
out["first"] = one_shot()
out["unchanged"] = one_shot()
with open(path, "rb") as f:
    saved = f.read()
# Another boot: the same netns and generation numbers mean nothing then.
doc = json.loads(saved)
for row in doc["outputs"]:
    row[1][0] = "00000000-0000-4000-8000-000000000000"
with open(os.path.join(state_dir, "other-boot.memo"), "w") as f:
    json.dump(doc, f)
out["other_boot"] = one_shot(os.path.join(state_dir, "other-boot.memo"))
# The IPv4 command's chains filed as IPv6 ones (each a valid chain): not this command's result.
doc = json.loads(saved)
for row in doc["outputs"]:
    if row[0].startswith("iptables:") and "/iptables-nft-save" in row[0]:
        for chain in row[2]:
            chain["family"] = "ipv6"
with open(os.path.join(state_dir, "misfiled.memo"), "w") as f:
    json.dump(doc, f)
out["misfiled"] = one_shot(os.path.join(state_dir, "misfiled.memo"))
sh("iptables-nft -t nat -N CNI-000000000000000000000002")
out["changed"] = one_shot()
# A new netns that gets the gone one's inode number (the kernel hands it on at once), brought
# to the same generation with other rules: only the cookie tells them apart.
with open(path, "wb") as f:
    f.write(saved)
tries = 0
while new_netns() != first_ino and tries < 300:
    time.sleep(0.01)  # the kernel frees a gone netns's number from a work queue
    tries += 1
out["same_ino"] = os.stat("/proc/self/ns/net").st_ino == first_ino
sh("iptables-nft -t nat -N CNI-0000000000000000000000ee")  # the same commits as in the first
sh("iptables-nft -N CNI-FORWARD && iptables-nft -A CNI-FORWARD -s 10.77.0.9/32 -j ACCEPT")
out["same_generation"] = ruleset_generation() == generation
out["reborn"] = one_shot()
print(json.dumps(out))
"""


def test_a_one_shot_reuses_a_saved_parse_only_in_the_same_boot_netns_and_generation(tmp_path: Path) -> None:
    out = run_probe(ONE_SHOTS, str(tmp_path))
    first, unchanged = out["first"], out["unchanged"]
    assert "iptables-nft-save" in first["ran"] and "CNI-000000000000000000000001" in first["chains"]
    assert first["warning"] is None and first["errors"] == []
    # A second process, nothing changed: the save is not run and the chains are the same.
    assert "iptables-nft-save" not in unchanged["ran"] and unchanged["chains"] == first["chains"]
    assert unchanged["warning"] is None
    # The firewall plugin's filter rules alike.
    assert "iptables-nft-save" in first["ran_filter"] and first["rules"] == ["-A CNI-FORWARD -s 10.77.0.5/32 -j ACCEPT"]
    assert "iptables-nft-save" not in unchanged["ran_filter"] and unchanged["rules"] == first["rules"]
    # Another boot id: run again.
    assert "iptables-nft-save" in out["other_boot"]["ran"] and out["other_boot"]["warning"] is None
    # Another family's records under this command's name: run again, and what it shows is used.
    misfiled = out["misfiled"]
    assert misfiled["warning"] is None and "iptables-nft-save" in misfiled["ran"]
    assert "ip6tables-nft-save" not in misfiled["ran"] and misfiled["chains"] == first["chains"]
    # A chain added: run again, and seen.
    assert "iptables-nft-save" in out["changed"]["ran"]
    assert "CNI-000000000000000000000002" in out["changed"]["chains"]
    # Same inode number, same generation, another namespace: run again, its own chains seen.
    if not (out["same_ino"] and out["same_generation"]):
        pytest.skip(f"no new netns got the same inode number and generation ({out}): proves nothing")
    reborn = out["reborn"]
    assert "iptables-nft-save" in reborn["ran"] and "iptables-nft-save" in reborn["ran_filter"]
    assert reborn["chains"] == ["CNI-0000000000000000000000ee"]
    assert reborn["rules"] == ["-A CNI-FORWARD -s 10.77.0.9/32 -j ACCEPT"]
