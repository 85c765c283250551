"""The netlink reader on a real kernel: every pin's nsid is the one of the namespace it pins,
for more pins than four batches of requests (1,024), so that each veth is tied by its peer to
the right pin. (pyroute2's request loop, used before, answered a few pins of 2,250 with another pin's
nsid: a veth then joined another attachment than the one its peer lives in.)"""

from __future__ import annotations

from tests.harness.probe import run_probe

# In a private mount and network namespace: pins, veths and mounts vanish with the process.
NSID_PROBE = """
import json, os, subprocess, tempfile
from reaper.host.netlink import dump_links, nsids_of
PINS = 1100
work = tempfile.mkdtemp()
subprocess.run(["mount", "-t", "tmpfs", "tmpfs", work], check=True)
pins = []
for i in range(PINS):
    pin = os.path.join(work, f"pin{i}")
    open(pin, "w").close()
    subprocess.run(["unshare", f"--net={pin}", "true"], check=True)
    pins.append(pin)
batch = "".join(f"link add h{i} type veth peer name eth0 netns {pin}\\n" for i, pin in enumerate(pins))
subprocess.run(["ip", "-batch", "-"], input=batch, text=True, check=True)
links, nsids = dump_links(), nsids_of(list(reversed(pins)))
by_name = {link.name: link for link in links}
wrong = [i for i, pin in enumerate(pins) if by_name[f"h{i}"].link_netnsid != nsids[pin][1]]
moved = [pin for pin in pins if nsids[pin][0].st_ino != os.stat(pin).st_ino]
print(json.dumps({"wrong": wrong, "moved": moved, "asked": len(nsids), "distinct": len({n for _, n in nsids.values()}),
                  "veths": sum(1 for link in dump_links() if link.kind == "veth")}))
"""


def test_every_pin_gets_the_nsid_of_its_own_namespace() -> None:
    out = run_probe(NSID_PROBE, timeout=300)
    assert out == {"wrong": [], "moved": [], "asked": 1100, "distinct": 1100, "veths": 1100}
