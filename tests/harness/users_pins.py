"""A mount namespace with no process in it, pinned by an unprivileged user (uid 65534 with
`unshare -Urm`, as the red-team did), in a private dir: its `/proc` is a tmpfs with a program at
`/proc/self/fd/0..255` that appends a line to a marker in a root-only dir, and it holds a
network namespace of the user's, mounted on a file there. The pin sits in the user's own mount
namespace (one process, sleeping) in the variant asked for:

- `plain`: on a file any walk of the user's root reaches;
- `shadow`: a tmpfs mounted over the pin's dir afterwards, so no path reaches it;
- `binfmt`: on binfmt_misc's `status`, a binfmt_misc mounted in the user namespace (Linux 6.7+).

With `as_root`, root makes the same (no user namespace): a root-made structure.

The program writes the value of the environment variable TAG (its name) of whoever ran it: other
reapers on a shared machine (older checkouts) walk every mount namespace too, so a test tells its
own reaper's runs (TAG set in its environment) from theirs."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

NOBODY = 65534
TAG = "PLANTED_PROGRAM_RUN_TAG"
AS_NOBODY = ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups"]

# Run in a mount namespace of the maker's own: $1 its dir, $2 the marker, $3 the variant.
ATTACK = r"""#!/bin/sh
set -e
U=$1; MARK=$2; VARIANT=$3; TAG=$4
export U MARK TAG
touch "$U/net-pin"
mkdir -p "$U/shadow"
touch "$U/shadow/mnt-pin"
TARGET="$U/shadow/mnt-pin"
if [ "$VARIANT" = binfmt ]; then
  mkdir -p "$U/bfm"; mount -t binfmt_misc binfmt_misc "$U/bfm"; TARGET="$U/bfm/status"
fi
ME=$(readlink /proc/self/ns/mnt)
tries=0
while :; do
  rm -f "$U/go"
  unshare -m --propagation private sh -c '
    while [ ! -e "$U/go" ]; do sleep 0.02; done
    unshare --net="$U/net-pin" sh -c "readlink /proc/self/ns/net > \"$U/net-id\""
    mount -t tmpfs tmpfs /proc
    mkdir -p /proc/self/fd
    i=0
    while [ $i -le 255 ]; do
      printf "#!/bin/sh\necho ran-as-\$(id -u) run=\$%s args=\$* >> %s\n" "$TAG" "$MARK" > /proc/self/fd/$i
      chmod 755 /proc/self/fd/$i
      i=$((i+1))
    done
    echo ready > "$U/x-ready"
    exec sleep 600
  ' &
  CHILD=$!
  while [ "$(readlink /proc/$CHILD/ns/mnt)" = "$ME" ]; do sleep 0.01; done
  # The kernel binds a mount namespace only above this one's id: made again until so.
  if mount --bind /proc/$CHILD/ns/mnt "$TARGET" 2>/dev/null; then break; fi
  kill $CHILD; wait $CHILD 2>/dev/null || true
  tries=$((tries+1)); [ $tries -lt 2000 ]
done
readlink /proc/$CHILD/ns/mnt > "$U/mnt-id"
touch "$U/go"
while [ ! -s "$U/x-ready" ]; do sleep 0.02; done
kill $CHILD; wait $CHILD 2>/dev/null || true
if [ "$VARIANT" = shadow ]; then mount -t tmpfs tmpfs "$U/shadow"; fi
echo pinned > "$U/m-ready"
exec sleep 600
"""


@dataclass(frozen=True)
class PinnedByUser:
    marker: Path  # written only if something ran the planted program: a line a run
    mount_ns: int  # the pinned mount namespace's inode (no process in it)
    netns: int  # the inode of the network namespace mounted inside it
    net_pin: str  # where, inside it
    holder: int  # pid of the maker's process (its own mount namespace holds the pin)

    def runs(self, tag: str) -> list[str]:
        """The planted program's runs by a process whose TAG was `tag`."""
        if not self.marker.exists():
            return []
        return [line for line in self.marker.read_text().splitlines() if f" run={tag} " in line]


def _inode(text: str) -> int:
    return int(text.strip().split("[")[1].rstrip("]"))


@contextlib.contextmanager
def pinned_by_user(variant: str, *, as_root: bool = False) -> Iterator[PinnedByUser]:
    """The structure of the module docstring, made and then taken down (its maker killed by
    pid: its mount namespace and all it pins go with it; the private dir removed)."""
    work = Path(tempfile.mkdtemp(prefix="users-pins-"))
    maker: subprocess.Popen[bytes] | None = None
    try:
        work.chmod(0o755)
        user, root_only = work / "u", work / "root-only"
        user.mkdir()
        root_only.mkdir(mode=0o700)
        script = work / "attack.sh"
        script.write_text(ATTACK)
        script.chmod(0o755)
        if not as_root:
            os.chown(user, NOBODY, NOBODY)
        wrap = ["unshare", "--mount", "--propagation", "private"]
        if not as_root:
            wrap = [*AS_NOBODY, "unshare", "--user", "--map-root-user", "--mount", "--propagation", "private"]
        marker = root_only / "marker"
        log = open(work / "log", "wb")  # noqa: SIM115 - closed below
        with log:
            argv = [*wrap, str(script), str(user), str(marker), variant, TAG]
            maker = subprocess.Popen(argv, stdout=log, stderr=log)
        deadline = time.monotonic() + 60
        while not (user / "m-ready").exists():
            assert maker.poll() is None, (work / "log").read_text()
            assert time.monotonic() < deadline, "the structure was not made in time"
            time.sleep(0.05)
        yield PinnedByUser(
            marker=marker,
            mount_ns=_inode((user / "mnt-id").read_text()),
            netns=_inode((user / "net-id").read_text()),
            net_pin=str(user / "net-pin"),
            holder=maker.pid,
        )
    finally:
        if maker is not None:
            maker.kill()
            maker.wait()
        shutil.rmtree(work, ignore_errors=True)
