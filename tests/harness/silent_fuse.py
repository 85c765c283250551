"""A FUSE filesystem that answers the kernel's handshake and nothing after it.

The server is a small process of its own (`python -m tests.harness.silent_fuse MOUNTPOINT`,
started by SilentFuse in a mount namespace of its own, so no other process on the machine ever
sees the mount): it opens /dev/fuse, mounts it on MOUNTPOINT, answers FUSE_INIT, then never
reads the device again. Every lookup, getattr or statfs below the mount then waits for an answer
that never comes, as on a FUSE or NFS mount whose server hung; a process waiting there is in
state D and a SIGKILL does not end it. From outside its namespace the mount is reached as
`/proc/<server pid>/root<MOUNTPOINT>/...`, as a pod's volume is reached from a hostPID pod.

Teardown aborts the connection (`/sys/fs/fuse/connections/<N>/abort`, fusectl mounted in the
server's own namespace), which fails every waiting request with ENOTCONN, then lets the server
unmount lazily and exit; its exit closes the last /dev/fuse fd, which aborts the connection
too, and ends the mount namespace and the mount with it.

The wire layout is include/uapi/linux/fuse.h of the kernel: a request is `fuse_in_header`
(len u32, opcode u32, unique u64, nodeid u64, uid u32, gid u32, pid u32, total_extlen u16,
padding u16) and its body (`fuse_init_in`: major, minor, max_readahead, flags, ...); a reply is
`fuse_out_header` (len u32, error s32, unique u64) and `fuse_init_out` (64 bytes: major,
minor, max_readahead, flags u32; max_background, congestion_threshold u16; max_write,
time_gran u32; max_pages, map_alignment u16; flags2, max_stack_depth u32; the rest unused).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import struct
import subprocess
import sys
from pathlib import Path
from types import TracebackType
from typing import Self

FUSE_INIT = 26
_IN_HEADER = struct.Struct("<IIQQIIIHH")
_OUT_HEADER = struct.Struct("<IiQ")
_INIT_IN = struct.Struct("<IIII")
_INIT_OUT = struct.Struct("<IIIIHHIIHHII")
INIT_OUT_SIZE = 64
MINOR = 31  # a protocol minor every kernel this runs on speaks (7.31: Linux 5.9)
READ_BUFFER = 1 << 20  # more than any request with max_write 4096 (the kernel wants >= 8 KiB)
MNT_DETACH = 2
MS_NOSUID = 2
MS_NODEV = 4
FUSECTL = "/sys/fs/fuse/connections"

_libc = ctypes.CDLL(None, use_errno=True)


def init_reply(request: bytes) -> bytes:
    """The answer to a FUSE_INIT request: protocol 7.MINOR, no optional features."""
    length, opcode, unique, *_ = _IN_HEADER.unpack_from(request)
    if opcode != FUSE_INIT or length != len(request):
        raise ValueError(f"expected FUSE_INIT, got opcode {opcode} ({length} bytes)")
    major, _minor, max_readahead, _flags = _INIT_IN.unpack_from(request, _IN_HEADER.size)
    body = _INIT_OUT.pack(major, MINOR, max_readahead, 0, 0, 0, 4096, 1, 0, 0, 0, 0)
    body += bytes(INIT_OUT_SIZE - len(body))
    return _OUT_HEADER.pack(_OUT_HEADER.size + len(body), 0, unique) + body


def _mount(source: str, target: str, fstype: str, flags: int, data: str | None) -> None:
    encoded = data.encode() if data is not None else None
    if _libc.mount(source.encode(), target.encode(), fstype.encode(), flags, encoded) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err), target)


def _connection_of(mountpoint: str) -> int:
    """The FUSE connection number of the mount at `mountpoint`: its device's number, read from
    mountinfo (a stat of the mount would wait on the server)."""
    with open("/proc/self/mountinfo", encoding="utf-8") as f:
        for line in f:
            fields = line.split()
            if fields[4] == mountpoint:
                major, minor = (int(x) for x in fields[2].split(":"))
                return (major << 20) | minor
    raise LookupError(f"{mountpoint} is not mounted")


def serve(mountpoint: str, rootmode: str) -> None:
    """Mount (the root a directory, rootmode 40000, or a regular file, 100000), answer the
    handshake, print `ready <connection>`, then wait for stdin to close (reading nothing more
    from the device), unmount lazily and exit."""
    with contextlib.suppress(OSError):  # EBUSY: fusectl is mounted here already
        _mount("fusectl", FUSECTL, "fusectl", 0, None)
    fd = os.open("/dev/fuse", os.O_RDWR | os.O_CLOEXEC)
    options = f"fd={fd},rootmode={rootmode},user_id=0,group_id=0,allow_other"
    _mount("silent-fuse", mountpoint, "fuse", MS_NOSUID | MS_NODEV, options)
    os.write(fd, init_reply(os.read(fd, READ_BUFFER)))
    print(f"ready {_connection_of(mountpoint)}", flush=True)
    sys.stdin.read()
    _libc.umount2(mountpoint.encode(), MNT_DETACH)
    os.close(fd)


class SilentFuse:
    """The silent FUSE mount at `mountpoint` (an empty directory, or with `on_file` a file, made
    when missing), in a mount namespace of its own, for the length of a `with` block."""

    def __init__(self, mountpoint: Path, *, on_file: bool = False) -> None:
        self.mountpoint = mountpoint
        self.on_file = on_file
        self._server: subprocess.Popen[str] | None = None
        self.connection = -1

    @property
    def pid(self) -> int:
        assert self._server is not None
        return self._server.pid

    def reach(self, name: str) -> str:
        """`name` below the mount, as a process outside its namespace reaches it."""
        return f"/proc/{self.pid}/root{self.mountpoint}/{name}"

    def __enter__(self) -> Self:
        if self.on_file:
            self.mountpoint.parent.mkdir(parents=True, exist_ok=True)
            self.mountpoint.touch()
        else:
            self.mountpoint.mkdir(parents=True, exist_ok=True)
        rootmode = "100000" if self.on_file else "40000"
        argv = ["unshare", "--mount", "--propagation", "private", "--"]
        argv += [sys.executable, "-m", "tests.harness.silent_fuse", str(self.mountpoint), rootmode]
        root = Path(__file__).resolve().parents[2]
        self._server = subprocess.Popen(
            argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=root
        )
        assert self._server.stdout is not None
        line = self._server.stdout.readline()
        if not line.startswith("ready "):
            self.__exit__(None, None, None)
            raise RuntimeError(f"the silent FUSE server did not start: {line!r}")
        self.connection = int(line.split()[1])
        return self

    def abort(self) -> None:
        """Fail every request waiting on the mount (ENOTCONN), now and after."""
        with contextlib.suppress(OSError):
            Path(f"/proc/{self.pid}/root{FUSECTL}/{self.connection}/abort").write_text("1")

    def __exit__(self, kind: type[BaseException] | None, err: BaseException | None, tb: TracebackType | None) -> None:
        server = self._server
        if server is None:
            return
        if self.connection >= 0:
            self.abort()
        assert server.stdin is not None
        with contextlib.suppress(OSError):
            server.stdin.close()
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait(timeout=30)
        for stream in (server.stdout, server.stderr):
            if stream is not None:
                stream.close()
        self._server = None


def run_beside(fuse: SilentFuse, argv: list[str], timeout: float) -> subprocess.CompletedProcess[str]:
    """Run `argv` to its end, or for `timeout` seconds: then the FUSE connection is aborted
    first (a process waiting on it cannot be killed before), the process killed, and
    TimeoutExpired raised with what it wrote."""
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        out, errs = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        fuse.abort()
        proc.kill()
        out, errs = proc.communicate(timeout=60)
        raise subprocess.TimeoutExpired(argv, timeout, out, errs) from None
    return subprocess.CompletedProcess(argv, proc.returncode, out, errs)


if __name__ == "__main__":
    serve(sys.argv[1], sys.argv[2])
