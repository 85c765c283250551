"""A one-shot scan keeps its memo beside the state file: the second scan reports what the first
did, a file rewritten in place (same size, same mtime) is read again, and a memo replaced by
garbage is not used (a warning says so) and is written anew. Whole passes, in a scratch netns."""

from __future__ import annotations

from pathlib import Path

from reaper.host.memo import MEMO_VERSION
from tests.harness.probe import run_probe

PROBE = """
import json, logging, os, stat, sys, time
from pathlib import Path
from reaper.model import Policy, RuntimeView
from reaper.names import compile_netns_patterns
from reaper.report import report_json
from reaper.runtime.static import StaticLiveness
from reaper.scan import scan_pass
from reaper.settings import Settings

work = Path(sys.argv[1])
for sub in ("netns", "ipam/mynet", "cache/results", "conf", "bin"):
    (work / sub).mkdir(parents=True, exist_ok=True)
A, B = "a" * 64, "b" * 64
entry = {"kind": "cniCacheV1", "containerId": A, "networkName": "mynet", "ifName": "eth0",
         "cniArgs": [["K8S_POD_NAMESPACE", "x"]], "result": {"cniVersion": "1.0.0"}}
(work / "cache/results" / f"mynet-{A}-eth0").write_text(json.dumps(entry))
lease = work / "ipam/mynet/10.88.0.5"
lease.write_bytes(f"{A}\\r\\neth0".encode())
time.sleep(2.5)  # files changed within 2 s of a pass are not remembered
settings = Settings(
    netns_dirs=(str(work / "netns"),), netns_patterns=compile_netns_patterns(()), ipam_dirs=(str(work / "ipam"),),
    cni_cache_dir=str(work / "cache"), cni_conf_dir=str(work / "conf"), cni_bin_dirs=(str(work / "bin"),),
    runtime_endpoints=(), runtime_timeout=1.0, policy=Policy(min_age=0.0, confirmations=1, stuck_after=900.0),
    state_file=str(work / "state.json"), json_output=True, log_format="text", log_level="warning",
)
runtime = StaticLiveness(RuntimeView("unix:///x.sock", "x", "1", True, None, ()))
warnings = []
class Keep(logging.Handler):
    def emit(self, record):
        warnings.append(record.getMessage())
log = logging.getLogger("probe")
log.addHandler(Keep())
memo = work / "state.json.memo"

def scan():
    report = report_json(scan_pass(settings, runtime, log).report)
    return sorted((a["container_id"], a["network"], a["ifname"], sorted(r["kind"] for r in a["resources"]))
                  for a in report["attachments"])

out = {"first": scan(), "memo_mode": oct(stat.S_IMODE(os.stat(memo).st_mode))}
out["saved"] = {k: len(v) for k, v in json.loads(memo.read_bytes())["kinds"].items()}
out["second"] = scan()
st = lease.stat()
lease.write_bytes(f"{B}\\r\\neth0".encode())  # same size, then the same mtime: only ctime tells
os.utime(lease, ns=(st.st_atime_ns, st.st_mtime_ns))
out["rewritten"] = scan()
memo.write_bytes(b"\\x00 not a memo")
out["garbage"] = scan()
out["warnings"] = warnings
out["rewritten_memo"] = json.loads(memo.read_bytes())["version"]
print(json.dumps(out))
"""


def test_a_one_shot_scan_keeps_its_memo_and_never_trusts_a_stale_or_broken_one(tmp_path: Path) -> None:
    out = run_probe(PROBE, str(tmp_path), private_mounts=False)
    a, b = "a" * 64, "b" * 64
    assert out["first"] == [[a, "mynet", "eth0", ["cache", "ipam"]]]
    assert out["memo_mode"] == "0o600" and out["saved"] == {"cache": 1, "ipam": 1}
    assert out["second"] == out["first"]
    assert out["rewritten"] == [[a, "mynet", "eth0", ["cache"]], [b, "mynet", "eth0", ["ipam"]]]
    assert out["garbage"] == out["rewritten"]
    assert sum("every file is read again" in w for w in out["warnings"]) == 1
    assert out["rewritten_memo"] == MEMO_VERSION
