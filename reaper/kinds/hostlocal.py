"""host-local IPAM allocations: `<data dir>/<network>/<ip>` files.

Identity: the file's path. Its content is host-local's key: the container ID, and from
plugins 0.8 on the ifname, so a lease with both is an attachment of its own and one with an
ID only joins that container's attachment on its network. Released under host-local's own
lock, only while the file still names the orphan.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import ipaddress
import os
import socket
import stat
import time
from collections import defaultdict
from collections.abc import Iterable, Iterator, Mapping, Sequence

from msgspec import Struct

from reaper.host.confined import UnfitFile, opened_dir, read_at
from reaper.host.files import DirLister, describe_oserror
from reaper.host.memo import FileMemo
from reaper.host.quarantine import Quarantine, remove_or_quarantine
from reaper.kinds import Found, Kind, Look, ReclaimContext
from reaper.kinds.netconf import host_local_range
from reaper.model import (
    ContainerTie,
    CorruptFile,
    DetailValue,
    Done,
    HostLocalRange,
    Identity,
    IpamRange,
    NetworkConfig,
    OwnKey,
    ResourceRef,
)
from reaper.names import is_cni_id, is_ifname
from reaper.podcidr import PodCidrs

MAX_LEASE_BYTES = 4096
LOCK_WAIT = 10.0  # seconds to wait for host-local's lock before leaving a network's leases
_LOCK_POLL = 0.02
_NOT_LEASES = ("lock",)
_RESERVED_PREFIX = "last_reserved_ip."


class HostLocalLease(Struct, frozen=True, kw_only=True, gc=False):
    network: str
    ip: str
    container_id: str
    ifname: str | None  # None in the legacy one-line format
    path: str
    data_dir: str
    mtime: float


def ip_key(text: str) -> tuple[int, int] | None:
    """(version, integer) of a canonical IP address string; None when it is not one. inet_pton,
    not ipaddress.ip_address, which builds an object per call: a node has thousands of leases."""
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
    if not is_cni_id(lines[0]):
        raise ValueError(f"invalid container ID {lines[0][:80]!r}")
    ifname = lines[1] if len(lines) == 2 else None
    if ifname is not None and not is_ifname(ifname):
        raise ValueError(f"invalid ifname {ifname[:80]!r}")
    return lines[0], ifname


def collect_leases(
    data_dirs: Iterable[str], memo: FileMemo[object] | None = None
) -> tuple[list[HostLocalLease], list[CorruptFile]]:
    memo = memo if memo is not None else FileMemo()
    leases: list[HostLocalLease] = []
    lister = DirLister("ipam")
    corrupt = lister.corrupt
    for data_dir in data_dirs:
        for _, net_entry in lister.scan(data_dir, data_dir):
            if not net_entry.is_dir(follow_symlinks=False):
                continue
            network = net_entry.name
            net_dir = os.path.join(data_dir, network)
            if not is_cni_id(network):
                corrupt.append(CorruptFile("ipam", net_dir, "directory name is not a CNI network name"))
                continue
            for dir_fd, entry in lister.scan(data_dir, net_dir):
                name = entry.name
                if name in _NOT_LEASES or name.startswith(_RESERVED_PREFIX):
                    continue
                path = os.path.join(net_dir, name)
                try:
                    lst = entry.stat(follow_symlinks=False)
                except OSError as err:
                    corrupt.append(CorruptFile("ipam", path, describe_oserror(err)))
                    continue
                known = memo.get(path, lst)
                if isinstance(known, CorruptFile):
                    corrupt.append(known)
                    continue
                said = known if isinstance(known, tuple) else _read_lease(dir_fd, entry, path)
                if isinstance(said, CorruptFile):
                    if corrupt.append(said):
                        memo.put(path, lst, said)  # only what is listed: junk costs no memory
                    continue
                if known is None:
                    memo.put(path, lst, said)
                leases.append(
                    HostLocalLease(
                        network=network,
                        ip=name,
                        container_id=said[0],
                        ifname=said[1],
                        path=path,
                        data_dir=data_dir,
                        mtime=lst.st_mtime,
                    )
                )
    return leases, list(corrupt.records())


def _read_lease(dir_fd: int, entry: os.DirEntry[str], path: str) -> tuple[str, str | None] | CorruptFile:
    if ip_key(entry.name) is None:
        return CorruptFile("ipam", path, "file name is not an IP address")
    if entry.is_symlink():
        return CorruptFile("ipam", path, "symlink, not followed")
    try:
        data, _ = read_at(dir_fd, entry.name, MAX_LEASE_BYTES)
        return parse_lease(data)
    except OSError as err:
        return CorruptFile("ipam", path, describe_oserror(err))
    except (UnfitFile, ValueError) as err:
        return CorruptFile("ipam", path, str(err))


def range_usage(
    configs: Iterable[NetworkConfig], leases: Iterable[HostLocalLease], pod_cidrs: PodCidrs | None = None
) -> list[IpamRange]:
    """Size and leases used of every host-local range a known config declares, and of those
    whose subnet is the node's pod CIDR when `pod_cidrs` has one of that IP version."""
    by_network: dict[str, list[tuple[int, int]]] = {}
    for lease in leases:
        key = ip_key(lease.ip)
        if key is not None:
            by_network.setdefault(lease.network, []).append(key)
    out: dict[tuple[str, str], IpamRange] = {}
    for config in configs:
        for spec in (*config.ipam_ranges, *_pod_cidr_ranges(config, pod_cidrs)):
            label = (config.name, _label(spec))
            if label in out:
                continue
            start = ipaddress.ip_address(spec.start)
            lo, hi = int(start), int(ipaddress.ip_address(spec.end))
            size = max(hi - lo + 1, 0)
            if spec.gateway is not None:
                gw = ipaddress.ip_address(spec.gateway)
                if gw.version == start.version and lo <= int(gw) <= hi:
                    size -= 1
            used = sum(
                1 for version, ip in by_network.get(config.name, ()) if version == start.version and lo <= ip <= hi
            )
            out[label] = IpamRange(config.name, label[1], size, used)
    return sorted(out.values(), key=lambda r: (r.network, r.range))


def _pod_cidr_ranges(config: NetworkConfig, pod_cidrs: PodCidrs | None) -> list[HostLocalRange]:
    if pod_cidrs is None:
        return []
    cidrs = (pod_cidrs.of_version(version) for version in config.pod_cidr_versions)
    return [host_local_range(cidr, {}) for cidr in cidrs if cidr is not None]


def _label(spec: HostLocalRange) -> str:
    default = host_local_range(spec.subnet, {})
    if (spec.start, spec.end) == (default.start, default.end):
        return spec.subnet
    return f"{spec.start}-{spec.end}"


def find(look: Look) -> Found[HostLocalLease]:
    data_dirs = list(look.options.ipam_dirs)
    for config in look.configs:
        data_dirs.extend(d for d in config.ipam_data_dirs if d not in data_dirs)
    leases, corrupt = collect_leases(data_dirs, look.memo.of("ipam"))
    return Found(tuple(leases), tuple(corrupt))


def identity(lease: HostLocalLease) -> Identity:
    return ("ipam", lease.path)


def still_leased(leases: Iterable[Identity], done: Mapping[Identity, Done]) -> str | None:
    """Why an address the `leases` held when the node was looked at may be someone's now (for a
    firewall or policy rule that frees it); None when it may go. A lease this pass freed lets it
    go, and so does one gone though not freed (the plugins' DEL released it); one it did not free,
    or whose file is there again (the orphan's still, or a new pod's already), keeps it."""
    for lease in leases:
        freed = done.get(lease)
        if freed is not None and freed.ok:
            continue
        if freed is not None or os.path.lexists(str(lease[-1])):
            return f"left: its address is still leased ({lease[-1]})"
    return None


def ref(lease: HostLocalLease) -> ResourceRef:
    details: dict[str, DetailValue] = {"path": lease.path, "ip": lease.ip}
    name = f"{lease.network}/{lease.ip}"
    return ResourceRef(kind="ipam", name=name, created_at=lease.mtime, details=details, identity=identity(lease))


def tie(lease: HostLocalLease) -> OwnKey | ContainerTie:
    if lease.ifname is None:
        return ContainerTie(lease.container_id, lease.network)
    return OwnKey(container_id=lease.container_id, network=lease.network, ifname=lease.ifname)


@contextlib.contextmanager
def locked(data_dir: str, directory: str, timeout: float = LOCK_WAIT) -> Iterator[int]:
    """flock(LOCK_EX) on <network dir>/lock, as host-local takes it; the network dir's fd."""
    with opened_dir(data_dir, directory) as dir_fd:
        fd = os.open(
            "lock", os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, 0o600, dir_fd=dir_fd
        )
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise OSError(errno.EINVAL, f"{directory}/lock is not a regular file")
            deadline = time.monotonic() + timeout
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() > deadline:
                        raise TimeoutError(f"lock {directory}/lock held for over {timeout:g}s") from None
                    time.sleep(_LOCK_POLL)
            yield dir_fd
        finally:
            os.close(fd)


def release_leases(
    leases: Sequence[HostLocalLease], quarantine: Quarantine | None, lock_wait: float = LOCK_WAIT
) -> dict[Identity, Done]:
    """Remove leases that still name their orphan, one lock hold per network directory."""
    by_dir: dict[tuple[str, str], list[HostLocalLease]] = defaultdict(list)
    for lease in leases:
        by_dir[(lease.data_dir, os.path.dirname(lease.path))].append(lease)
    done: dict[Identity, Done] = {}
    for (data_dir, directory), group in by_dir.items():
        try:
            with locked(data_dir, directory, lock_wait) as dir_fd:
                for lease in group:
                    done[identity(lease)] = _release(dir_fd, lease, quarantine)
        except OSError as err:  # TimeoutError too: the lock held past lock_wait
            for lease in group:
                done.setdefault(identity(lease), Done.left(describe_oserror(err)))
    return done


def _release(dir_fd: int, lease: HostLocalLease, quarantine: Quarantine | None) -> Done:
    try:
        data, st = read_at(dir_fd, lease.ip, MAX_LEASE_BYTES)
        cid, ifname = parse_lease(data)
    except FileNotFoundError:
        return Done.freed()
    except (OSError, UnfitFile, ValueError) as err:
        return Done.left(f"cannot re-read: {err}")
    if cid != lease.container_id or (lease.ifname is not None and ifname is not None and ifname != lease.ifname):
        return Done.left("now names another container; left alone")
    return remove_or_quarantine(lease.data_dir, lease.path, st, quarantine)


def reclaim(leases: Sequence[HostLocalLease], ctx: ReclaimContext) -> dict[Identity, Done]:
    return release_leases(leases, ctx.quarantine)


def addresses(lease: HostLocalLease) -> tuple[str, ...]:
    return (lease.ip,)


KIND: Kind[HostLocalLease] = Kind(
    name="ipam",
    find=find,
    identity=identity,
    ref=ref,
    tie=tie,
    reclaim=reclaim,
    quarantinable=True,
    claims=addresses,
    frees=addresses,
    with_addresses=True,
)
