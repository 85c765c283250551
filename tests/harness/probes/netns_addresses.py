"""The addresses of namespaces read each from inside it: two pins, a process's namespace, a pin
swapped for another namespace, a symlink (at its end, or on the way beneath a holder's root), a
pid that is gone, a reading past its deadline.
Run in a private mount and network namespace (pins, mounts and namespaces vanish with it);
prints what each reading gave, as JSON."""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
import threading
import time

from reaper.host.netns_addrs import Handle, NamespaceToRead, read_addresses, this_threads_netns
from reaper.model import NsKey


def key(path: str) -> NsKey:
    st = os.stat(path)
    return NsKey(st.st_dev, st.st_ino)


def pin(work: str, name: str, address: str) -> tuple[str, NsKey]:
    path = os.path.join(work, name)
    open(path, "w").close()
    script = f"ip link set lo up && ip addr add {address} dev lo"
    subprocess.run(["unshare", f"--net={path}", "sh", "-c", script], check=True)
    return path, key(path)


def main() -> None:
    work = tempfile.mkdtemp()
    subprocess.run(["mount", "-t", "tmpfs", "tmpfs", work], check=True)
    subprocess.run(["sh", "-c", "ip link set lo up && ip addr add 10.77.0.9/32 dev lo"], check=True)
    a, a_ns = pin(work, "a", "10.77.0.1/32")
    b, b_ns = pin(work, "b", "fd00:77::1/128")
    inside = "ip link set lo up && ip addr add 10.77.0.3/32 dev lo && echo ready && exec sleep 60"
    proc = subprocess.Popen(["unshare", "--net", "sh", "-c", inside], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
    p_ns = key(f"/proc/{proc.pid}/ns/net")
    os.symlink(a, os.path.join(work, "link"))
    # A mount point as its holder sees it, beneath the holder's root (here `work`): walked with
    # no symlink followed, so a link on the way is refused where it would lead to the pin.
    os.mkdir(os.path.join(work, "dir"))
    os.symlink(work, os.path.join(work, "dir", "up"))
    here = this_threads_netns()
    of_proc = Handle(f"/proc/{proc.pid}/ns/net", False)
    targets = [
        NamespaceToRead(here, "here", ()),
        NamespaceToRead(a_ns, "a", (Handle(a, True),)),
        NamespaceToRead(b_ns, "b", (Handle(b, True),)),
        NamespaceToRead(p_ns, "proc", (of_proc,)),
        NamespaceToRead(a_ns, "swapped", (Handle(b, True),)),
        NamespaceToRead(a_ns, "symlink", (Handle(os.path.join(work, "link"), True),)),
        NamespaceToRead(p_ns, "fallback", (Handle("/proc/999999999/ns/net", False), of_proc)),
        NamespaceToRead(a_ns, "beneath", (Handle("/a", True, beneath=work),)),
        NamespaceToRead(a_ns, "beneath, through a link", (Handle("/dir/up/a", True, beneath=work),)),
    ]
    got = read_addresses(targets, deadline=time.monotonic() + 20)
    late = read_addresses(targets[1:2], deadline=time.monotonic() - 1)
    proc.kill()
    proc.wait()
    gone = read_addresses([NamespaceToRead(p_ns, "gone", (of_proc,))], deadline=time.monotonic() + 5)
    left = read_addresses(
        [NamespaceToRead(p_ns, "left", (of_proc,), only_processes=True)], deadline=time.monotonic() + 5
    )
    # A pin that is gone is no process that left: still an error.
    nothing = Handle(os.path.join(work, "nothing"), True)
    pin_gone = read_addresses(
        [NamespaceToRead(p_ns, "pin", (nothing,), only_processes=True)], deadline=time.monotonic() + 5
    )
    time.sleep(0.2)
    print(
        json.dumps(
            {
                "got": {r.where: [list(r.addresses), r.error] for r in got},
                "late": [late[0].addresses, late[0].error],
                "gone": [gone[0].addresses, bool(gone[0].error)],
                "left": [left[0].addresses, left[0].error],
                "pin_gone": bool(pin_gone[0].error),
                "home": this_threads_netns() == here,
                "readers": [t.name for t in threading.enumerate() if t.name == "netns-addresses"],
            }
        )
    )


if __name__ == "__main__":
    main()
