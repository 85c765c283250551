"""Confirmation counts and the state file others may rewrite, over whole passes in a scratch
netns: a one-shot's count carried from the file stands for at most `confirmations - 1` passes,
and the agent counts from what it saved itself, whatever the file says in between."""

from __future__ import annotations

from pathlib import Path

from tests.harness.probe import run_probe

PROBE = """
import json, logging, os, sys
from pathlib import Path
from reaper.model import Policy, RuntimeView
from reaper.names import compile_netns_patterns
from tests.harness.static_liveness import StaticLiveness
from reaper.scan import scan_pass
from reaper.settings import Settings
from reaper.state import KeptState

work = Path(sys.argv[1])
for sub in ("netns", "ipam/mynet", "cache", "conf", "bin"):
    (work / sub).mkdir(parents=True, exist_ok=True)
A = "a" * 64
lease = work / "ipam/mynet/10.88.0.5"
lease.write_bytes(f"{A}\\r\\neth0".encode())
os.utime(lease, (1_000_000, 1_000_000))  # old: min-age is met
state = work / "state.json"
settings = Settings(
    netns_dirs=(str(work / "netns"),), netns_patterns=compile_netns_patterns(()), ipam_dirs=(str(work / "ipam"),),
    cni_cache_dir=str(work / "cache"), cni_conf_dir=str(work / "conf"), cni_bin_dirs=(str(work / "bin"),),
    runtime_endpoints=(), runtime_timeout=1.0, policy=Policy(min_age=0.0, confirmations=3, stuck_after=900.0),
    state_file=str(state), json_output=True, log_format="text", log_level="warning",
)
runtime = StaticLiveness(
    RuntimeView(endpoint="unix:///x.sock", name="x", version="1", reachable=True, error=None, sandboxes=())
)
log = logging.getLogger("probe")
KEY = f"{A}/mynet/eth0"

def forge():
    # Whoever writes the state dir says the lease has had no owner for a million passes.
    doc = json.loads(state.read_bytes())
    doc["attachments"][KEY] = [1.0, 10**6, 0]  # last counted: never, so this pass counts
    state.write_text(json.dumps(doc))

def verdict(**kw):
    (a,) = scan_pass(settings, runtime, log, **kw).report.attachments
    return [a.verdict, a.reason]

out = {}
out["fresh"] = verdict()
forge()
out["one_shot_after_forgery"] = verdict()
out["saved_count"] = json.loads(state.read_bytes())["attachments"][KEY][1]
state.unlink()
kept = KeptState()
out["agent_first"] = verdict(kept=kept)
forge()
out["agent_second"] = verdict(kept=kept)
forge()
out["agent_third"] = verdict(kept=kept)
print(json.dumps(out))
"""


def test_a_forged_count_costs_a_one_shot_at_most_all_but_one_pass_and_the_agent_none(tmp_path: Path) -> None:
    out = run_probe(PROBE, str(tmp_path))
    assert out["fresh"] == ["pending", "no owner on 1 of 3 required passes"]
    # One-shot: the file is its only memory; a raised count stands for two passes, never three.
    assert out["one_shot_after_forgery"][0] == "orphan"
    assert out["saved_count"] == 3, "what a pass saves is never above the confirmations"
    # The agent: after its first pass it counts its own passes, whatever the file says.
    assert out["agent_first"] == ["pending", "no owner on 1 of 3 required passes"]
    assert out["agent_second"] == ["pending", "no owner on 2 of 3 required passes"]
    assert out["agent_third"][0] == "orphan"


NETNS_PROBE = """
import json, logging, sys
from pathlib import Path
from reaper.model import Policy
from reaper.names import compile_netns_patterns
from reaper.runtime.cri import CriLiveness
from reaper.scan import scan_pass
from reaper.settings import Settings
from reaper.state import KeptState
from tests.harness.fake_cri import FakeRuntime, sandbox, sandbox_list

work = Path(sys.argv[1])
for sub in ("netns", "ipam", "cache", "conf", "bin"):
    (work / sub).mkdir(parents=True, exist_ok=True)
CREATED = 1_700_000_000_000_000_000
state = work / "state.json"
settings = Settings(
    netns_dirs=(str(work / "netns"),), netns_patterns=compile_netns_patterns(()), ipam_dirs=(str(work / "ipam"),),
    cni_cache_dir=str(work / "cache"), cni_conf_dir=str(work / "conf"), cni_bin_dirs=(str(work / "bin"),),
    runtime_endpoints=(f"unix://{work}/cri.sock",), runtime_timeout=5.0,
    policy=Policy(min_age=0.0, confirmations=1, stuck_after=900.0),
    state_file=str(state), json_output=True, log_format="text", log_level="warning",
)
log = logging.getLogger("probe")

def plant():
    # Whoever writes the state dir says where the live sandbox's netns is.
    doc = json.loads(state.read_bytes()) if state.exists() else {"version": 2}
    doc["sandbox_netns"] = {f"web@{CREATED}": "/run/netns/planted"}
    state.write_text(json.dumps(doc))

def netns_seen(**kw):
    (web,) = scan_pass(settings, CriLiveness(settings.runtime_endpoints, 5.0), log, **kw).report.runtime.sandboxes
    return web.netns_path

out = {}
listed = sandbox_list([sandbox("web", created_at=CREATED)])
with FakeRuntime(work / "cri.sock", listed, {"web": "/run/netns/cni-web"}) as cri:
    plant()
    out["one_shot"] = [netns_seen(), cri.calls["PodSandboxStatus"]]
    plant()
    out["one_shot_again"] = [netns_seen(), cri.calls["PodSandboxStatus"]]
    kept = KeptState()
    plant()
    out["agent_first"] = [netns_seen(kept=kept), cri.calls["PodSandboxStatus"]]
    plant()
    out["agent_second"] = [netns_seen(kept=kept), cri.calls["PodSandboxStatus"]]
    out["saved_keys"] = sorted(json.loads(state.read_bytes()))
print(json.dumps(out))
"""


def test_a_netns_planted_in_the_state_file_never_stands_for_the_runtimes_answer(tmp_path: Path) -> None:
    """The state file holds no runtime's answer: a `sandbox_netns` entry a writer of the state
    dir plants for a listed sandbox (older versions kept that map there) is never used. Every
    one-shot asks the runtime's PodSandboxStatus; the agent asks once per sandbox and remembers
    the answer in memory, whatever the file says between its passes."""
    out = run_probe(NETNS_PROBE, str(tmp_path))
    assert out["one_shot"] == ["/run/netns/cni-web", 1], "the runtime is asked, the planted path unused"
    assert out["one_shot_again"] == ["/run/netns/cni-web", 2], "a one-shot remembers nothing from the file"
    assert out["agent_first"] == ["/run/netns/cni-web", 3]
    assert out["agent_second"] == ["/run/netns/cni-web", 3], "the agent's own memory answers, not the file"
    assert "sandbox_netns" not in out["saved_keys"]
