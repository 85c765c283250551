"""`make demo`: a private containerd lab with live pods, both seed leaks and runtime-lost leaks,
then `reaper scan` on it, as an operator would run it on a node. Tears everything down after.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

from tests.harness.lab import Lab, PortMap
from tests.harness.reaper_cli import lab_flags


def say(text: str) -> None:
    print(f"\n==> {text}", flush=True)


def main() -> int:
    with Lab() as lab, tempfile.TemporaryDirectory(prefix="reaper-demo-") as tmp:
        say(f"lab up: containerd {lab.endpoint}, network {lab.network_name} on bridge {lab.bridge} ({lab.subnet})")
        pods = []
        for name, ports in (("web", [PortMap(8080, 80)]), ("api", []), ("db", [])):
            sandbox = lab.run_pod(name, port_mappings=ports)
            pods.append((name, sandbox))
            print(f"    pod {name:<4} {sandbox[:12]}  ip {lab.pod_ip(sandbox)}")
        say("seed report 1: a chained conflist whose last plugin fails ADD")
        lab.set_network("failing")
        chained = lab.try_run_pod("chained")
        print(f"    RunPodSandbox failed: {(chained.error or '')[:100]}")
        say("seed report 2: containerd with no CNI config")
        lab.set_network("empty")
        nocni = lab.try_run_pod("nocni")
        print(f"    RunPodSandbox failed: {(nocni.error or '')[:100]}")
        lab.set_network("normal")
        say("leaks the runtime never knew of (its state lost): real plugins, with and without a cache entry")
        for with_cache in (True, False):
            leak = lab.make_leak(with_cache=with_cache, port_mappings=[PortMap(9090, 90)] if with_cache else [])
            cached = "yes" if with_cache else "no"
            print(f"    {leak.container_id[:12]}  ip {leak.ip}  veth {leak.host_veth}  cache {cached}")

        state = Path(tmp) / "state.json"
        argv = ["nsenter", f"--net={lab.netns_path}", sys.executable, "-m", "reaper", "scan"]
        argv += [*lab_flags(lab, state), "--min-age", "0", "--confirmations", "1", "--stuck-after", "0"]
        say("reaper scan --min-age 0 --confirmations 1 --stuck-after 0   (the lab is seconds old)")
        print("    " + " ".join(a for a in argv[3:] if not a.startswith("--net=")), flush=True)
        print()
        code = subprocess.run(argv, check=False).returncode
        say(f"reaper scan exited {code} (0 clean, 1 orphans found, 2 could not decide)")

        reap = ["nsenter", f"--net={lab.netns_path}", sys.executable, "-m", "reaper", "reap"]
        # A lab this small is mostly leaks: above the default breaker ratio, so it is raised.
        reap += [*lab_flags(lab, state), "--min-age", "0", "--confirmations", "1", "--max-orphan-ratio", "1"]
        say("reaper reap --min-age 0 --confirmations 1 --max-orphan-ratio 1")
        reaped = subprocess.run(reap, check=False, stdout=subprocess.PIPE, text=True)
        print(reaped.stdout[reaped.stdout.find("RECLAIMED") :] if "RECLAIMED" in reaped.stdout else reaped.stdout)
        say(f"reaper reap exited {reaped.returncode} (0 every orphan reclaimed)")

        say("reaper scan again: the node is clean, the live pods untouched")
        again = subprocess.run(argv, check=False).returncode
        for name, sandbox in pods:
            ping = lab.run_in_netns(["ping", "-c", "1", "-W", "2", lab.pod_ip(sandbox)])
            print(f"    ping pod {name} ({lab.pod_ip(sandbox)}): {'answers' if ping.returncode == 0 else 'NO ANSWER'}")
        say("tearing the lab down")
    return 0 if code in (0, 1) and reaped.returncode == 0 and again == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
