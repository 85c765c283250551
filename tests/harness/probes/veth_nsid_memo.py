"""The pins' nsids as the look asks for them, on a private tmpfs of pins (a FIFO, a symlink, a
device, a plain file and a dir among them), with this process's nsid requests counted by pin.
Usage: veth_nsid_memo memo|one-shot; run in a private mount and network namespace (pins,
veths and mounts vanish with it). Prints each look's ties and what was asked, as JSON.

memo: an agent's memo over three looks, the namespace at one pin replaced between the second
and the third by another with the same inode number and another nsid. one-shot: one look with
no memo, a veth's peer pinned outside the netns dirs and a symlink to it planted among them."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
import time

from reaper.host import netlink
from reaper.host.memo import InventoryMemo
from reaper.kinds import netns, veth
from reaper.kinds.registry import Registry
from reaper.options import FindOptions
from reaper.snapshot import take_snapshot
from tests.harness.passes import settled_memo


class Pins:
    """The tmpfs of pins, and the nsid requests made since."""

    def __init__(self) -> None:
        self.asked: list[list[str]] = []
        real_nsids = netlink._nsids

        def counting(nl: netlink.Netlink, paths: list[str]) -> dict[str, tuple[os.stat_result, int]]:
            self.asked.append(sorted(os.path.basename(p) for p in paths))  # the real requests, counted
            return real_nsids(nl, paths)

        netlink._nsids = counting
        self.work = tempfile.mkdtemp()
        subprocess.run(["mount", "-t", "tmpfs", "tmpfs", self.work], check=True)
        self.dir = os.path.join(self.work, "netns")
        os.mkdir(self.dir)
        os.mkfifo(os.path.join(self.dir, "fifo"))
        os.symlink("a", os.path.join(self.dir, "link"))
        os.mknod(os.path.join(self.dir, "null"), 0o600 | 0o020000, os.makedev(1, 3))
        open(os.path.join(self.dir, "plain"), "w").close()
        os.mkdir(os.path.join(self.dir, "dir"))
        self.options = FindOptions(
            netns_dirs=(self.dir,),
            ipam_dirs=(),
            cache_dir=self.work,
            conf_dir=self.work,
            bin_dirs=(),
            netns_patterns=(re.compile("x"),),
        )

    def pin(self, name: str) -> str:
        path = os.path.join(self.dir, name)
        open(path, "w").close()
        sh("unshare", f"--net={path}", "true")
        return path

    def ties(self, memo: InventoryMemo | None = None) -> tuple[dict[str, list[int] | None], list[str]]:
        """Each veth's peer namespace as the look tied it, and the look's errors."""
        snap = take_snapshot(self.options, memo, Registry(kinds=(netns.KIND, veth.KIND)))
        veths = {v.name: list(v.peer_netns) if v.peer_netns else None for v in snap.of("veth")}
        return veths, [e.error for e in snap.errors]


def sh(*argv: str) -> None:
    subprocess.run(argv, check=True, capture_output=True)


def veth_into(host: str, path: str) -> None:
    sh("ip", "link", "add", host, "type", "veth", "peer", "name", "eth0", "netns", path)


def key(path: str) -> list[int]:
    st = os.stat(path)
    return [st.st_dev, st.st_ino]


def memo_case(pins: Pins) -> dict[str, object]:
    memo = settled_memo()
    a = pins.pin("a")
    veth_into("ha", a)
    first, _ = pins.ties(memo)
    a_before = key(a)
    second, _ = pins.ties(memo)
    # The namespace at a dies; a new one takes its inode number. Another namespace takes the dead
    # one's nsid first, so the new namespace at a gets another nsid than the memo holds.
    sh("ip", "link", "del", "ha")
    for _ in range(50):  # the dead namespace's number is free once the kernel's cleanup ran
        sh("umount", a)
        time.sleep(0.2)
        sh("unshare", f"--net={a}", "true")
        if key(a) == a_before:
            break
    f = pins.pin("f")
    veth_into("hf", f)
    veth_into("ha2", a)
    third, _ = pins.ties(memo)
    everything = [os.path.join(pins.dir, name) for name in sorted(os.listdir(pins.dir))]
    answered = netlink.nsids_of(everything)
    return {
        "answered": sorted(os.path.basename(p) for p in answered),
        "first": first,
        "second": second,
        "third": third,
        "asked": pins.asked,
        "a_before": a_before,
        "a": key(a),
        "f": key(f),
    }


def one_shot_case(pins: Pins) -> dict[str, object]:
    a, b = pins.pin("a"), pins.pin("b")
    veth_into("ha", a)
    veth_into("hb", b)
    # A namespace pinned outside the netns dirs, with a veth: the look knows no pin of it.
    outside = os.path.join(pins.work, "outside")
    open(outside, "w").close()
    sh("unshare", f"--net={outside}", "true")
    veth_into("hx", outside)
    os.symlink(outside, os.path.join(pins.dir, "cni-to-outside"))  # planted: a link to a namespace elsewhere
    return {"one_shot": pins.ties(), "asked": pins.asked, "a": key(a), "b": key(b)}


def main(case: str) -> None:
    cases = {"memo": memo_case, "one-shot": one_shot_case}
    print(json.dumps(cases[case](Pins())))


if __name__ == "__main__":
    main(sys.argv[1])
