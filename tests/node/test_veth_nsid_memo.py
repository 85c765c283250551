"""The agent's memo of pin nsids on a real kernel: a pin unchanged since the last pass is not
asked again, and a namespace that died and was replaced at the same path, with the same inode
number (the kernel reuses it at once) and another nsid, is asked again, so every veth still
joins the namespace its peer is in. Pins that are no namespace (a FIFO, a symlink, a device, a
plain file) get no nsid and never block the pass."""

from __future__ import annotations

from tests.harness.probe import run_probe

# A private tmpfs of pins (a FIFO, a symlink, a device, a plain file and a dir among them),
# and this process's nsid requests counted by pin.
SETUP = """
import json, os, re, subprocess, tempfile, time
import reaper.host.netlink as netlink
from reaper.kinds import FindOptions, netns, veth
from reaper.snapshot import take_snapshot

asked = []
real_nsids = netlink._nsids
def counting(nl, paths):  # the real requests, counted
    asked.append(sorted(os.path.basename(p) for p in paths))
    return real_nsids(nl, paths)
netlink._nsids = counting

work = tempfile.mkdtemp()
subprocess.run(["mount", "-t", "tmpfs", "tmpfs", work], check=True)
pins = os.path.join(work, "netns")
os.mkdir(pins)
def sh(*argv):
    subprocess.run(argv, check=True, capture_output=True)
def pin(name):
    path = os.path.join(pins, name)
    open(path, "w").close()
    sh("unshare", f"--net={path}", "true")
    return path
def veth_into(host, path):
    sh("ip", "link", "add", host, "type", "veth", "peer", "name", "eth0", "netns", path)
def key(path):
    st = os.stat(path)
    return [st.st_dev, st.st_ino]

os.mkfifo(os.path.join(pins, "fifo"))
os.symlink("a", os.path.join(pins, "link"))
os.mknod(os.path.join(pins, "null"), 0o600 | 0o020000, os.makedev(1, 3))
open(os.path.join(pins, "plain"), "w").close()
os.mkdir(os.path.join(pins, "dir"))
"""

# In a private mount and network namespace: pins, veths and mounts vanish with the process.
PROBE = (
    SETUP
    + """
from tests.harness.passes import settled_memo

opts = FindOptions(
    netns_dirs=(pins,), ipam_dirs=(), cache_dir=work, conf_dir=work, bin_dirs=(), netns_patterns=(re.compile("x"),)
)
memo = settled_memo()
def ties():
    snap = take_snapshot(opts, memo, kinds=(netns.KIND, veth.KIND))
    return {v.name: list(v.peer_netns) if v.peer_netns else None for v in snap.of("veth")}

a = pin("a")
veth_into("ha", a)
first = ties()
a_before = key(a)
second = ties()
# The namespace at a dies; a new one takes its inode number. Another namespace takes the dead
# one's nsid first, so the new namespace at a gets another nsid than the memo holds.
sh("ip", "link", "del", "ha")
for _ in range(50):  # the dead namespace's number is free once the kernel's cleanup ran
    sh("umount", a)
    time.sleep(0.2)
    sh("unshare", f"--net={a}", "true")
    if key(a) == a_before:
        break
f = pin("f")
veth_into("hf", f)
veth_into("ha2", a)
third = ties()
everything = [os.path.join(pins, name) for name in sorted(os.listdir(pins))]
answered = netlink.nsids_of(everything)
print(json.dumps({
    "answered": sorted(os.path.basename(p) for p in answered),
    "first": first, "second": second, "third": third, "asked": asked,
    "a_before": a_before, "a": key(a), "f": key(f),
}))
"""
)


def test_memo_answers_unchanged_pins_and_never_a_replaced_namespace() -> None:
    out = run_probe(PROBE)
    # The dangerous case did happen: same path, same inode number, another namespace.
    assert out["a"] == out["a_before"], "the kernel did not reuse the inode number; the test proves nothing"
    assert out["first"] == {"ha": out["a_before"]}
    assert out["second"] == out["first"]
    assert out["third"] == {"ha2": out["a"], "hf": out["f"]}
    # Asked: every namespace pin once (never the FIFO, link, device, plain file or dir: they
    # are looked at and refused), then nothing, then the replaced pin and the new one.
    assert out["asked"][:2] == [["a"], ["a", "f"]]
    # Asked of everything in the dir, only the namespaces answer, and nothing blocks.
    assert out["asked"][2] == ["a", "dir", "f", "fifo", "link", "null", "plain"]
    assert out["answered"] == ["a", "f"]


ONE_SHOT_PROBE = (
    SETUP
    + """
a, b = pin("a"), pin("b")
veth_into("ha", a)
veth_into("hb", b)
# A namespace pinned outside the netns dirs, with a veth: the look knows no pin of it.
outside = os.path.join(work, "outside")
open(outside, "w").close()
sh("unshare", f"--net={outside}", "true")
veth_into("hx", outside)
os.symlink(outside, os.path.join(pins, "cni-to-outside"))  # planted: a link to a namespace elsewhere
opts = FindOptions(
    netns_dirs=(pins,), ipam_dirs=(), cache_dir=work, conf_dir=work, bin_dirs=(), netns_patterns=(re.compile("x"),)
)
def ties(options):
    snap = take_snapshot(options, kinds=(netns.KIND, veth.KIND))
    veths = {v.name: list(v.peer_netns) if v.peer_netns else None for v in snap.of("veth")}
    return veths, [e.error for e in snap.errors]
print(json.dumps({"one_shot": ties(opts), "asked": asked, "a": key(a), "b": key(b)}))
"""
)


def test_a_one_shot_ties_every_veth_to_the_pin_its_peer_is_in() -> None:
    """A look with no memo: every veth tied to the pinned namespace its peer is in, one whose
    peer is in a namespace pinned elsewhere to none (a symlink to that pin planted among the
    pins included), and only the namespace pins the netns kind found are asked."""
    out = run_probe(ONE_SHOT_PROBE)
    veths, errors = out["one_shot"]
    assert errors == []
    assert veths == {"ha": out["a"], "hb": out["b"], "hx": None}
    assert out["asked"] == [["a", "b"]]
