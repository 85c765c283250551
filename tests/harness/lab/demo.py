"""`make demo`: a private containerd lab with live pods, both seed leaks and runtime-lost leaks,
then the reaper on it as an operator would run it on a node: a first `reaper scan` with the
default grace (everything is too young: `pending`), then with the grace dropped, the plan of
`reaper reap --dry-run`, one `reaper reap`, and a last scan. Tears everything down after.

Each command is printed as it would be typed on a node; here each runs inside the lab's network
namespace (the veths and chains the reaper reports are those of the netns it runs in).
"""

from __future__ import annotations

import shlex
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from tests.harness.lab import Lab, PortMap
from tests.harness.reaper_cli import lab_flags

# The lab is seconds old: without these nothing in it is an orphan yet (see the first scan).
NO_GRACE = ("--min-age", "0", "--confirmations", "1")


def say(text: str) -> None:
    print(f"\n==> {text}", flush=True)


def typed(argv: Sequence[str]) -> str:
    """The command as an operator types it on a node: `reaper ...`, shell-quoted."""
    return shlex.join(["reaper", *argv])


def indented(text: str, prefix: str = "    ") -> str:
    """`text` whole, each of its lines indented: an error is shown as the runtime said it."""
    return "\n".join(prefix + line for line in (text.strip() or "(no error text)").splitlines())


def reaper_in(lab: Lab, argv: Sequence[str], *, capture: bool = False) -> subprocess.CompletedProcess[str]:
    """`reaper ARGV` inside the lab's network namespace, its command line printed first."""
    print(indented("$ " + typed(argv)), flush=True)
    print(flush=True)
    command = ["nsenter", f"--net={lab.netns_path}", sys.executable, "-m", "reaper", *argv]
    return subprocess.run(command, check=False, text=True, stdout=subprocess.PIPE if capture else None)


def main() -> int:
    with Lab() as lab, tempfile.TemporaryDirectory(prefix="reaper-demo-") as tmp:
        say(f"lab up: containerd {lab.endpoint}, network {lab.network_name} on bridge {lab.bridge} ({lab.subnet})")
        pods = []
        for name, ports in (("web", [PortMap(8080, 80)]), ("api", []), ("db", [])):
            sandbox = lab.run_pod(name, port_mappings=ports)
            pods.append((name, sandbox))
            print(f"    pod {name:<4} {sandbox[:12]}  ip {lab.pod_ip(sandbox)}")
        say("seed report 1: a chained conflist whose last plugin fails ADD; RunPodSandbox said:")
        lab.set_network("failing")
        print(indented(lab.try_run_pod("chained").error or ""))
        say("seed report 2: containerd with no CNI config; RunPodSandbox said:")
        lab.set_network("empty")
        print(indented(lab.try_run_pod("nocni").error or ""))
        lab.set_network("normal")
        say("leaks the runtime never knew of (its state lost): real plugins, with and without a cache entry")
        for with_cache in (True, False):
            leak = lab.make_leak(with_cache=with_cache, port_mappings=[PortMap(9090, 90)] if with_cache else [])
            cached = "yes" if with_cache else "no"
            print(f"    {leak.container_id[:12]}  ip {leak.ip}  veth {leak.host_veth}  cache {cached}")

        flags = lab_flags(lab, Path(tmp) / "state.json")
        say(
            "each command below is what you would type on a node, with the lab's dirs and socket as flags;\n"
            f"    here it runs inside the lab's network namespace: nsenter --net={lab.netns_path} reaper ..."
        )
        say("a first run as on a node, with the default grace (--min-age 10m, --confirmations 2)")
        first = reaper_in(lab, ["scan", *flags]).returncode
        say(
            f"reaper scan exited {first} (0 clean, 1 orphans found, 2 could not decide): the leaks are `pending`,\n"
            "    too young and seen once; a node's timer run finds them orphaned 10 minutes and two passes on"
        )

        say("the demo cannot wait: the same scan with the grace dropped")
        code = reaper_in(lab, ["scan", *flags, *NO_GRACE, "--stuck-after", "0"]).returncode
        say(f"reaper scan exited {code}")

        # A lab this small is mostly leaks: above the default breaker ratio, so it is raised.
        reap = ["reap", *flags, *NO_GRACE, "--max-orphan-ratio", "1"]
        say("the plan: what `reaper reap` would do, step by step; nothing is changed")
        planned = reaper_in(lab, [*reap, "--dry-run"]).returncode
        say(f"reaper reap --dry-run exited {planned} (1: there is something to reclaim)")

        say("one reclaiming pass")
        reaped = reaper_in(lab, reap, capture=True)
        print(reaped.stdout[reaped.stdout.find("RECLAIMED") :] if "RECLAIMED" in reaped.stdout else reaped.stdout)
        say(f"reaper reap exited {reaped.returncode} (0 every orphan reclaimed)")

        say("reaper scan again: the node is clean, the live pods untouched")
        again = reaper_in(lab, ["scan", *flags, *NO_GRACE, "--stuck-after", "0"]).returncode
        for name, sandbox in pods:
            ping = lab.run_in_netns(["ping", "-c", "1", "-W", "2", lab.pod_ip(sandbox)])
            print(f"    ping pod {name} ({lab.pod_ip(sandbox)}): {'answers' if ping.returncode == 0 else 'NO ANSWER'}")
        say("tearing the lab down")
    return 0 if first == 0 and code in (0, 1) and reaped.returncode == 0 and again == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
