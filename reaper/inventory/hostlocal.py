"""host-local IPAM allocations: `<data dir>/<network>/<ip>` files."""

from __future__ import annotations

import ipaddress
import os
import socket
from collections.abc import Iterable

from reaper.inventory.fsutil import UnfitFile, describe_oserror, read_file_with_stat
from reaper.inventory.memo import FileMemo
from reaper.model import CorruptFile, HostLocalLease, HostLocalRange, IpamRange, NetworkConfig
from reaper.names import is_cni_id, is_ifname

MAX_LEASE_BYTES = 4096
_NOT_LEASES = ("lock",)
_RESERVED_PREFIX = "last_reserved_ip."


def ip_key(text: str) -> tuple[int, int] | None:
    """(version, integer) of a canonical IP address string; None when it is not one.

    socket.inet_pton in C: ipaddress.ip_address costs ~10 us a call, and a node has thousands.
    """
    try:
        packed = socket.inet_pton(socket.AF_INET, text)
        return 4, int.from_bytes(packed, "big")
    except (OSError, ValueError):  # ValueError: an embedded NUL
        pass
    try:
        packed = socket.inet_pton(socket.AF_INET6, text)
    except (OSError, ValueError):
        return None
    # host-local names v6 files in compressed lowercase form; anything else is not its file.
    if socket.inet_ntop(socket.AF_INET6, packed) != text:
        return None
    return 6, int.from_bytes(packed, "big")


def parse_lease(data: bytes) -> tuple[str, str | None]:
    """(container ID, ifname or None) from a lease file's content; ValueError when it is not one."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise ValueError("not UTF-8") from None
    lines = [line.strip() for line in text.strip().splitlines()]
    if not lines or not lines[0]:
        raise ValueError("empty lease")
    if len(lines) > 2:
        raise ValueError("more than two lines")
    container_id = lines[0]
    if not is_cni_id(container_id):
        raise ValueError(f"invalid container ID {container_id[:80]!r}")
    ifname = lines[1] if len(lines) == 2 else None
    if ifname is not None and not is_ifname(ifname):
        raise ValueError(f"invalid ifname {ifname[:80]!r}")
    return container_id, ifname


def _network_dirs(data_dir: str) -> list[os.DirEntry[str]]:
    return [e for e in os.scandir(data_dir) if e.is_dir(follow_symlinks=False)]


def collect_leases(
    data_dirs: Iterable[str], memo: FileMemo[object] | None = None
) -> tuple[list[HostLocalLease], list[CorruptFile]]:
    memo = memo if memo is not None else FileMemo()
    leases: list[HostLocalLease] = []
    corrupt: list[CorruptFile] = []
    seen: set[tuple[int, int]] = set()
    for data_dir in data_dirs:
        try:
            st = os.stat(data_dir)
            if (st.st_dev, st.st_ino) in seen:
                continue
            seen.add((st.st_dev, st.st_ino))
            networks = _network_dirs(data_dir)
        except FileNotFoundError:
            continue
        except OSError as err:
            corrupt.append(CorruptFile("ipam", data_dir, describe_oserror(err)))
            continue
        for net_entry in networks:
            network = net_entry.name
            if not is_cni_id(network):
                corrupt.append(CorruptFile("ipam", net_entry.path, "directory name is not a CNI network name"))
                continue
            try:
                files = list(os.scandir(net_entry.path))
            except OSError as err:
                corrupt.append(CorruptFile("ipam", net_entry.path, describe_oserror(err)))
                continue
            for entry in files:
                name = entry.name
                if name in _NOT_LEASES or name.startswith(_RESERVED_PREFIX):
                    continue
                try:
                    lst = entry.stat(follow_symlinks=False)
                except OSError as err:
                    corrupt.append(CorruptFile("ipam", entry.path, describe_oserror(err)))
                    continue
                known = memo.get(entry.path, lst)
                if isinstance(known, (HostLocalLease, CorruptFile)):
                    lease = known
                else:
                    lease = _read_lease(entry, network, data_dir)
                    memo.put(entry.path, lst, lease)
                if isinstance(lease, CorruptFile):
                    corrupt.append(lease)
                else:
                    leases.append(lease)
    return leases, corrupt


def _read_lease(entry: os.DirEntry[str], network: str, data_dir: str) -> HostLocalLease | CorruptFile:
    path = entry.path
    if ip_key(entry.name) is None:
        return CorruptFile("ipam", path, "file name is not an IP address")
    if entry.is_symlink():
        return CorruptFile("ipam", path, "symlink, not followed")
    try:
        data, st = read_file_with_stat(path, MAX_LEASE_BYTES)
        container_id, ifname = parse_lease(data)
    except OSError as err:
        return CorruptFile("ipam", path, describe_oserror(err))
    except (UnfitFile, ValueError) as err:
        return CorruptFile("ipam", path, str(err))
    return HostLocalLease(network, entry.name, container_id, ifname, path, data_dir, st.st_mtime)


def range_usage(configs: Iterable[NetworkConfig], leases: Iterable[HostLocalLease]) -> list[IpamRange]:
    """Size and leases used of every host-local range a known config declares."""
    by_network: dict[str, list[tuple[int, int]]] = {}
    for lease in leases:
        key = ip_key(lease.ip)
        if key is not None:
            by_network.setdefault(lease.network, []).append(key)
    out: dict[tuple[str, str], IpamRange] = {}
    for config in configs:
        for spec in config.ipam_ranges:
            label = (config.name, _label(spec))
            if label in out:
                continue
            start, end = ipaddress.ip_address(spec.start), ipaddress.ip_address(spec.end)
            size = int(end) - int(start) + 1 if int(end) >= int(start) else 0
            if spec.gateway is not None:
                gw = ipaddress.ip_address(spec.gateway)
                if gw.version == start.version and int(start) <= int(gw) <= int(end):
                    size -= 1
            lo, hi = int(start), int(end)
            used = sum(
                1 for version, ip in by_network.get(config.name, ()) if version == start.version and lo <= ip <= hi
            )
            out[label] = IpamRange(config.name, label[1], max(size, 0), used)
    return sorted(out.values(), key=lambda r: (r.network, r.range))


def _label(spec: HostLocalRange) -> str:
    net = ipaddress.ip_network(spec.subnet)
    default_start = net.network_address + 1
    default_end = net.broadcast_address - 1 if net.version == 4 else net.broadcast_address
    if ipaddress.ip_address(spec.start) == default_start and ipaddress.ip_address(spec.end) == default_end:
        return spec.subnet
    return f"{spec.start}-{spec.end}"
