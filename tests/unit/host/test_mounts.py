"""Reading /proc/self/mountinfo: which mount holds a path, and how it propagates."""

from __future__ import annotations

from reaper.host.mounts import propagation_of

MOUNTINFO = "\n".join(
    [
        "27 1 254:0 / / rw,relatime shared:1 - ext4 /dev/vda rw",
        "40 27 0:30 / /run rw,nosuid - tmpfs tmpfs rw",
        "41 40 0:4 / /run/netns rw master:7 - tmpfs tmpfs rw",
        "42 41 0:4 net:[4026532300] /run/netns/cni-1 rw shared:9 master:7 - nsfs nsfs rw",
        "43 27 0:31 / /var/lib/my\\040dir rw shared:12 - tmpfs tmpfs rw",
        "44 27 0:32 / /srv/netns rw - tmpfs tmpfs rw",
        "45 44 254:0 /tmp/lab/netns /srv/netns rw shared:3 - ext4 /dev/vda rw",  # bound on top
        "garbage line",
    ]
)


def test_the_longest_mount_point_holding_the_path_decides() -> None:
    assert propagation_of("/run/netns", MOUNTINFO) == {"master"}
    assert propagation_of("/run/netns-other", MOUNTINFO) == set()  # under /run, a private mount
    assert propagation_of("/run/netns/cni-1", MOUNTINFO) == {"shared", "master"}
    assert propagation_of("/var/lib/my dir/x", MOUNTINFO) == {"shared"}
    assert propagation_of("/etc", MOUNTINFO) == {"shared"}
    assert propagation_of("/srv/netns/cni-2", MOUNTINFO) == {"shared"}  # the mount on top counts
