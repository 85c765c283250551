"""Reading the addresses of other network namespaces on a real kernel, each from inside it: a
pin's and a process's namespace each give their own addresses; a pin swapped for another
namespace, a symlink, or a pid that is gone give an error, never another namespace's addresses
(but a namespace found only through processes that have all exited reads as empty);
the deadline ends the reading; and the calling thread never leaves its namespace."""

from __future__ import annotations

from tests.harness.probe import run_probe

# In a private mount and network namespace: pins, mounts and namespaces vanish with the process.
PROBE = """
import json, os, subprocess, tempfile, threading, time
from reaper.host.netns_addrs import Handle, NamespaceToRead, read_addresses, this_threads_netns
from reaper.model import NsKey

work = tempfile.mkdtemp()
subprocess.run(["mount", "-t", "tmpfs", "tmpfs", work], check=True)
subprocess.run(["sh", "-c", "ip link set lo up && ip addr add 10.77.0.9/32 dev lo"], check=True)

def key(path):
    st = os.stat(path)
    return NsKey(st.st_dev, st.st_ino)

def pin(name, address):
    path = os.path.join(work, name)
    open(path, "w").close()
    script = f"ip link set lo up && ip addr add {address} dev lo"
    subprocess.run(["unshare", f"--net={path}", "sh", "-c", script], check=True)
    return path, key(path)

a, a_ns = pin("a", "10.77.0.1/32")
b, b_ns = pin("b", "fd00:77::1/128")
proc = subprocess.Popen(["unshare", "--net", "sh", "-c",
                         "ip link set lo up && ip addr add 10.77.0.3/32 dev lo && echo ready && exec sleep 60"],
                        stdout=subprocess.PIPE, text=True)
assert proc.stdout.readline().strip() == "ready"
p_ns = key(f"/proc/{proc.pid}/ns/net")
os.symlink(a, os.path.join(work, "link"))
here = this_threads_netns()
targets = [
    NamespaceToRead(here, "here", ()),
    NamespaceToRead(a_ns, "a", (Handle(a, True),)),
    NamespaceToRead(b_ns, "b", (Handle(b, True),)),
    NamespaceToRead(p_ns, "proc", (Handle(f"/proc/{proc.pid}/ns/net", False),)),
    NamespaceToRead(a_ns, "swapped", (Handle(b, True),)),
    NamespaceToRead(a_ns, "symlink", (Handle(os.path.join(work, "link"), True),)),
    NamespaceToRead(p_ns, "fallback", (
        Handle("/proc/999999999/ns/net", False), Handle(f"/proc/{proc.pid}/ns/net", False))),
]
got = read_addresses(targets, deadline=time.monotonic() + 20)
late = read_addresses(targets[1:2], deadline=time.monotonic() - 1)
proc.kill()
proc.wait()
gone = read_addresses([NamespaceToRead(p_ns, "gone", (Handle(f"/proc/{proc.pid}/ns/net", False),))],
                      deadline=time.monotonic() + 5)
left = read_addresses([NamespaceToRead(p_ns, "left", (Handle(f"/proc/{proc.pid}/ns/net", False),),
                                       only_processes=True)], deadline=time.monotonic() + 5)
# A pin that is gone is no process that left: still an error.
pin_gone = read_addresses([NamespaceToRead(p_ns, "pin", (Handle(os.path.join(work, "nothing"), True),),
                                           only_processes=True)], deadline=time.monotonic() + 5)
time.sleep(0.2)
print(json.dumps({
    "got": {r.where: [list(r.addresses), r.error] for r in got},
    "late": [late[0].addresses, late[0].error],
    "gone": [gone[0].addresses, bool(gone[0].error)],
    "left": [left[0].addresses, left[0].error],
    "pin_gone": bool(pin_gone[0].error),
    "home": this_threads_netns() == here,
    "readers": [t.name for t in threading.enumerate() if t.name == "netns-addresses"],
}))
"""


def test_each_namespace_is_read_from_inside_it_and_only_the_one_found_there() -> None:
    out = run_probe(PROBE, timeout=120)
    assert out["got"] == {
        "here": [["10.77.0.9", "127.0.0.1", "::1"], None],
        "a": [["10.77.0.1", "127.0.0.1", "::1"], None],
        "b": [["127.0.0.1", "::1", "fd00:77::1"], None],
        "proc": [["10.77.0.3", "127.0.0.1", "::1"], None],
        "swapped": [[], "another namespace is there now"],
        "symlink": [[], "not a namespace pin now"],  # the link itself, never followed
        "fallback": [["10.77.0.3", "127.0.0.1", "::1"], None],
    }
    assert out["late"] == [[], "not read by the deadline"]
    assert out["gone"] == [[], True]
    # Every process the namespace was found through has exited, and nothing else held it.
    assert out["left"] == [[], None]
    assert out["pin_gone"] is True
    assert out["home"] is True and out["readers"] == [], "the caller stays home; the reader thread ended"
