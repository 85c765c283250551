"""A network namespace uid 65534 makes and holds, with addresses of its choosing configured.

uid 65534, with unprivileged user namespaces (`setpriv` to 65534, then `unshare -Urm`), makes a
network namespace of its own (`unshare -n` in its user namespace), configures the given
addresses on its `lo` and binds it on a file in its own mount namespace; the process that made
it exits, so only that mount holds it. The mount is, by variant:

- `plain`: on a file in a dir of the user's, which any walk of its mounts reaches;
- `covered`: on a file whose dir a tmpfs then covers, so no path reaches it;
- `binfmt`: on the `status` file of a binfmt_misc mounted in its user namespace (Linux 6.7 on).

The maker then sleeps: its mount namespace, and the network namespace held there, last as
long as it does. close() kills it by its pid (everything it made goes with its namespaces) and
removes its dir.
"""

from __future__ import annotations

import ipaddress
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

NOBODY = 65534
AS_NOBODY = ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups"]
Variant = Literal["plain", "covered", "binfmt"]

# $1 the user's dir, $2 the variant, then the addresses; says "ready" once the mount is made.
MAKE = r"""
U=$1; VARIANT=$2; shift 2
ADDS=""
for a in "$@"; do ADDS="$ADDS ip addr add $a dev lo;"; done
mkdir "$U/d"
if [ "$VARIANT" = binfmt ]; then
  mount -t binfmt_misc binfmt_misc "$U/d"; T="$U/d/status"
else
  T="$U/d/net"; touch "$T"
fi
unshare -n sh -euc "ip link set lo up; $ADDS mount --bind /proc/self/ns/net \"\$0\"" "$T"
if [ "$VARIANT" = covered ]; then mount -t tmpfs tmpfs "$U/d"; fi
echo ready
exec sleep 600
"""


@dataclass
class UsersNetns:
    """The maker (its pid in the reasons the reaper gives) and the dir its mount is under."""

    maker: subprocess.Popen[str]
    work: Path

    def close(self) -> None:
        self.maker.kill()
        self.maker.wait()
        shutil.rmtree(self.work, ignore_errors=True)


def users_netns(variant: Variant, addresses: list[str]) -> UsersNetns | str:
    """The structure of the module docstring; why not, in one line, when this kernel does not
    let uid 65534 make it."""
    for address in addresses:
        ipaddress.ip_interface(address)  # only addresses go into the script's text
    work = Path(tempfile.mkdtemp(prefix="users-netns-"))
    work.chmod(0o755)
    user = work / "u"
    user.mkdir()
    shutil.chown(user, NOBODY, NOBODY)
    argv = [*AS_NOBODY, "unshare", "-Urm", "sh", "-euc", MAKE, "sh", str(user), variant, *addresses]
    maker = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    made = UsersNetns(maker, work)
    assert maker.stdout is not None and maker.stderr is not None
    if maker.stdout.readline().strip() != "ready":
        made.close()
        return f"uid {NOBODY} could not make a {variant} netns: {maker.stderr.read().strip()[-300:]}"
    return made
