"""A network namespace holding as many addresses as its maker wants: run in one (`unshare -n`
as root, `unshare -Urn` as any user), it configures COUNT IPv4 /32s spread over veth pairs,
says "ready", and keeps the namespace until killed.

`python -m tests.harness.address_flood COUNT [FIRST]` (FIRST: the first address, 11.0.0.0 by
default). The addresses are sent as RTM_NEWADDR requests many to a write, acknowledged only
when they fail, so the kernel's work is the cost, not a round trip per address (`ip -batch`
waits for each); they are spread over devices because the kernel walks a device's list of
addresses for each one it adds.
"""

from __future__ import annotations

import ipaddress
import socket
import struct
import subprocess
import sys
import time

RTM_NEWADDR = 20
NLM_F_REQUEST, NLM_F_EXCL, NLM_F_CREATE = 0x1, 0x200, 0x400
IFA_LOCAL, IFA_ADDRESS = 2, 1
PER_DEVICE = 1000  # addresses a device: veth pairs enough for that
PER_WRITE = 2000
_HDR = struct.Struct("=IHHII")
_IFA = struct.Struct("=BBBBI")


def _attr(atype: int, payload: bytes) -> bytes:
    return struct.pack("=HH", 4 + len(payload), atype) + payload


def fill(count: int, first: ipaddress.IPv4Address) -> None:
    pairs = max(1, -(-count // (2 * PER_DEVICE)))
    links = "".join(f"link add f{2 * n} type veth peer name f{2 * n + 1}\n" for n in range(pairs))
    subprocess.run(["ip", "link", "set", "lo", "up"], check=True)
    subprocess.run(["ip", "-batch", "-"], input=links.encode(), check=True)
    indexes = [socket.if_nametoindex(f"f{n}") for n in range(2 * pairs)]
    with socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, 0) as nl:
        nl.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 20)
        nl.bind((0, 0))
        nl.setblocking(False)
        batch: list[bytes] = []
        for i in range(count):
            packed = (first + i).packed
            body = _IFA.pack(socket.AF_INET, 32, 0, 0, indexes[i % len(indexes)])
            body += _attr(IFA_LOCAL, packed) + _attr(IFA_ADDRESS, packed)
            flags = NLM_F_REQUEST | NLM_F_CREATE | NLM_F_EXCL
            batch.append(_HDR.pack(_HDR.size + len(body), RTM_NEWADDR, flags, i + 1, 0) + body)
            if len(batch) == PER_WRITE or i == count - 1:
                nl.setblocking(True)
                nl.sendall(b"".join(batch))
                nl.setblocking(False)
                batch.clear()
                _no_errors(nl)
        time.sleep(0.1)
        _no_errors(nl)


def _no_errors(nl: socket.socket) -> None:
    """Raise on any error the kernel answered with (only failures are answered)."""
    while True:
        try:
            data = nl.recv(1 << 16)
        except BlockingIOError:
            return
        off = 0
        while off + _HDR.size <= len(data):
            length, mtype, _, seq, _ = _HDR.unpack_from(data, off)
            if mtype == 2:  # NLMSG_ERROR
                code = -struct.unpack_from("=i", data, off + _HDR.size)[0]
                if code:
                    raise OSError(code, f"address {seq}: the kernel refused it")
            off += (length + 3) & ~3


def main() -> None:
    count = int(sys.argv[1])
    first = ipaddress.IPv4Address(sys.argv[2] if len(sys.argv) > 2 else "11.0.0.0")
    fill(count, first)
    print("ready", flush=True)
    time.sleep(3600)


if __name__ == "__main__":
    main()
