"""Report-only by default, as an operator meets it on the command line: `reaper scan` run by hand
twice in a row counts one confirmation, not two; and in a process whose REAPER_MODE is scan (a
report-only pod, `kubectl exec ... reaper reap`), a reap is refused unless --force.

Each probe runs the real `reaper` command in a network namespace and mount namespace of its own
(nothing of the host's links or firewall is seen or touched), beside a CRI runtime made to order
that lists no sandbox, with one old host-local lease of a container it does not list."""

from __future__ import annotations

from pathlib import Path

from tests.harness.probe import run_probe

PROBE = """
import json, os, subprocess, sys
from pathlib import Path
from tests.harness.fake_cri import FakeRuntime, sandbox_list

work = Path(sys.argv[1])
for sub in ("netns", "ipam/mynet", "cache", "conf", "bin"):
    (work / sub).mkdir(parents=True, exist_ok=True)
A = "a" * 64
lease = work / "ipam/mynet/10.88.0.5"
lease.write_bytes(f"{A}\\r\\neth0".encode())
os.utime(lease, (1_000_000, 1_000_000))  # old: min-age is met
KEY = f"{A}/mynet/eth0"
FLAGS = ["--netns-dir", str(work / "netns"), "--ipam-dir", str(work / "ipam"), "--cni-cache-dir", str(work / "cache"),
         "--cni-conf-dir", str(work / "conf"), "--cni-bin-dir", str(work / "bin"),
         "--runtime-endpoint", f"unix://{work}/cri.sock", "--state-file", str(work / "state.json"), "--min-age", "0"]
ENV = {k: v for k, v in os.environ.items() if not k.startswith("REAPER_")}

def reaper(command, *extra, env=None):
    run = subprocess.run([sys.executable, "-m", "reaper", command, "--json", *FLAGS, *extra],
                         capture_output=True, text=True, timeout=60, env={**ENV, **(env or {})})
    doc = json.loads(run.stdout) if run.stdout.startswith("{") else None
    attachments = (doc.get("attachments") or doc.get("report", {}).get("attachments", [])) if doc else []
    verdicts = [a["verdict"] for a in attachments]
    return {"status": run.returncode, "stderr": run.stderr, "verdicts": verdicts}

def saved_count():
    return json.loads((work / "state.json").read_text())["attachments"][KEY][1]

out = {}
with FakeRuntime(work / "cri.sock", sandbox_list([]), {}):
    if sys.argv[2] == "twice":
        out["first"] = reaper("scan", "--confirmations", "2")
        out["second"] = reaper("scan", "--confirmations", "2")
        out["count"] = saved_count()
    else:
        scan_pod = {"REAPER_MODE": "scan"}
        out["refused"] = reaper("reap", "--confirmations", "1", env=scan_pod)
        out["lease_after_refusal"] = lease.exists()
        out["dry_run"] = reaper("reap", "--confirmations", "1", "--dry-run", env=scan_pod)
        out["forced"] = reaper("reap", "--confirmations", "1", "--force", env=scan_pod)
        out["lease_after_force"] = lease.exists()
print(json.dumps(out))
"""


def test_two_scans_by_hand_seconds_apart_count_one_confirmation(tmp_path: Path) -> None:
    out = run_probe(PROBE, str(tmp_path), "twice")
    assert out["first"]["verdicts"] == ["pending"], out["first"]
    # On the second run the leak is still pending: it came seconds after the first, under the
    # 30s spacing half the default --interval sets; the state file still says one pass.
    assert (out["second"]["status"], out["second"]["verdicts"]) == (0, ["pending"]), out["second"]
    assert out["count"] == 1


def test_a_reap_where_the_mode_is_scan_is_refused_unless_forced(tmp_path: Path) -> None:
    out = run_probe(PROBE, str(tmp_path), "mode")
    refused = out["refused"]
    assert refused["status"] == 2 and refused["verdicts"] == []
    lines = refused["stderr"].splitlines()
    assert len(lines) == 1 and lines[0].startswith("reaper: REAPER_MODE is scan here"), refused["stderr"]
    assert "--force" in lines[0] and "Traceback" not in refused["stderr"]
    assert out["lease_after_refusal"], "nothing was reclaimed"
    assert out["dry_run"]["status"] == 1 and out["dry_run"]["verdicts"] == ["orphan"], "a plan changes nothing"
    # --force, the operator's say-so, reclaims (the breaker too is overridden by it).
    assert out["forced"]["status"] == 0, out["forced"]
    assert not out["lease_after_force"]
