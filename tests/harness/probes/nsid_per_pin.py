"""1,100 pins, each with a veth whose peer is in it, and the nsid netlink answers for each pin
(more pins than four batches of requests). Run in a private mount and network namespace (the
pins, veths and mounts vanish with it); prints what was wrong, as JSON."""

from __future__ import annotations

import json
import os
import subprocess
import tempfile

from reaper.host.netlink import dump_links, nsids_of

PINS = 1100


def main() -> None:
    work = tempfile.mkdtemp()
    subprocess.run(["mount", "-t", "tmpfs", "tmpfs", work], check=True)
    pins = []
    for i in range(PINS):
        pin = os.path.join(work, f"pin{i}")
        open(pin, "w").close()
        subprocess.run(["unshare", f"--net={pin}", "true"], check=True)
        pins.append(pin)
    batch = "".join(f"link add h{i} type veth peer name eth0 netns {pin}\n" for i, pin in enumerate(pins))
    subprocess.run(["ip", "-batch", "-"], input=batch, text=True, check=True)
    links, nsids = dump_links(), nsids_of(list(reversed(pins)))
    by_name = {link.name: link for link in links}
    wrong = [i for i, pin in enumerate(pins) if by_name[f"h{i}"].link_netnsid != nsids[pin][1]]
    moved = [pin for pin in pins if nsids[pin][0].st_ino != os.stat(pin).st_ino]
    veths = sum(1 for link in dump_links() if link.kind == "veth")
    print(
        json.dumps(
            {
                "wrong": wrong,
                "moved": moved,
                "asked": len(nsids),
                "distinct": len({n for _, n in nsids.values()}),
                "veths": veths,
            }
        )
    )


if __name__ == "__main__":
    main()
