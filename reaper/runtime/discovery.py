"""Which CRI runtimes a node has: every known socket, and the kubelet's configured endpoint.

A process named kubelet is believed only when pid 1 could have started it as the node's
kubelet; any other's endpoint is reported, never asked. Every socket is resolved with every
component root's alone (reaper.host.resolve) and reached through the fd the walk ends on;
one that exists and cannot be followed is "could not be asked". Processes are read through an
fd of their /proc dir. Why: docs/design.md, "Finding the CRI runtimes".
"""

from __future__ import annotations

import contextlib
import os
import re
import stat
from collections.abc import Iterable, Iterator

from msgspec import Struct

from reaper.host.confined import RESOLVE_IN_ROOT, RESOLVE_NO_MAGICLINKS, openat2
from reaper.host.resolve import Resolved, Unfollowed, checked_socket, resolve_in_root

UNIX = "unix://"
# Where each runtime puts its CRI socket by default.
KNOWN_SOCKETS: tuple[tuple[str, str], ...] = (
    ("containerd", "/run/containerd/containerd.sock"),
    ("containerd", "/var/run/containerd/containerd.sock"),
    ("cri-o", "/run/crio/crio.sock"),
    ("cri-o", "/var/run/crio/crio.sock"),
    ("cri-dockerd", "/run/cri-dockerd.sock"),
    ("cri-dockerd", "/var/run/cri-dockerd.sock"),
    ("k3s --docker", "/run/k3s/cri-dockerd/cri-dockerd.sock"),
    ("k3s/rke2", "/run/k3s/containerd/containerd.sock"),
    ("microk8s", "/var/snap/microk8s/common/run/containerd.sock"),
)
KUBELET_CONFIG_DEFAULT = "/var/lib/kubelet/config.yaml"
MAX_CMDLINE = 1 << 16
MAX_KUBELET_CONFIG = 1 << 20
MAX_STATUS = 1 << 14
_ENDPOINT_FLAG = "--container-runtime-endpoint"
MAX_DROP_INS = 256
_CONFIG_ENDPOINT = re.compile(r"""^containerRuntimeEndpoint:\s*["']?([^"'\s#]+)["']?\s*(?:#.*)?$""", re.MULTILINE)
NAME_THEM = "if that runtime is gone for good, name the node's runtimes with --runtime-endpoint"
# A socket file nobody listens on: a runtime that crashed (its sandboxes are still its own).
REFUSED = "could not be asked: nobody listens on it (connection refused: a runtime that crashed or was stopped)"


class Endpoint(Struct, frozen=True):
    url: str  # unix:///path
    source: str  # where it was found: "flag", "kubelet --container-runtime-endpoint", "known socket (cri-o)"
    refused: str | None = None  # why it is reported, not asked: a process not the node's kubelet named it
    # An O_PATH fd of the checked socket, what the client connects to (None: the URL as given);
    # whoever made the Endpoint closes it (close_all).
    fd: int | None = None
    unaskable: str | None = None  # why a runtime that is there could not be asked: the pass waits

    @property
    def path(self) -> str:
        return socket_path(self.url)

    @property
    def target(self) -> str:
        """What the client connects to: the checked socket itself, else the URL."""
        return self.url if self.fd is None else f"{UNIX}/proc/self/fd/{self.fd}"


def close_all(endpoints: Iterable[Endpoint]) -> None:
    for endpoint in endpoints:
        if endpoint.fd is not None:
            with contextlib.suppress(OSError):
                os.close(endpoint.fd)


def socket_path(url: str) -> str:
    return url[len(UNIX) :] if url.startswith(UNIX) else url


def as_url(value: str) -> str | None:
    """A runtime endpoint as the kubelet accepts it (unix:///path or a bare /path), as a URL."""
    if value.startswith(UNIX + "/"):
        return value
    if value.startswith("/"):
        return UNIX + value
    return None  # tcp:// and npipe:// are not CRI sockets this reaper can reach


def flag_value(argv: list[str], flag: str) -> str | None:
    """The last value of `flag` in a Go-style command line (`--flag=v` or `--flag v`)."""
    found = None
    for i, arg in enumerate(argv):
        if arg.startswith(flag + "="):
            found = arg[len(flag) + 1 :]
        elif arg == flag and i + 1 < len(argv):
            found = argv[i + 1]
    return found


def endpoint_in_config(text: str) -> str | None:
    """`containerRuntimeEndpoint` of a KubeletConfiguration (YAML, or JSON on one line)."""
    match = _CONFIG_ENDPOINT.search(text) or re.search(r'"containerRuntimeEndpoint"\s*:\s*"([^"]+)"', text)
    return match.group(1) if match else None


def _read(path: str, limit: int, dir_fd: int | None = None) -> bytes | None:
    """At most `limit` bytes of a regular file; None for anything else (a planted FIFO or device)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dir_fd)
    except OSError:
        return None
    return _read_fd(fd, limit)


def _read_fd(fd: int, limit: int) -> bytes | None:
    """_read of a file open on `fd` (closed here)."""
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        return os.read(fd, limit)
    except OSError:
        return None
    finally:
        os.close(fd)


def _open_in_root(pid_fd: int, path: str, flags: int) -> int | None:
    """`path` opened with `flags` in the root of the process whose /proc dir is `pid_fd`, every
    symlink resolved in that root (by path through /proc/<pid>/root, an absolute link would
    resolve in the reaper's root); None when it cannot be."""
    try:
        root_fd = os.open("root", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC, dir_fd=pid_fd)
    except OSError:
        return None
    try:
        fd = openat2(root_fd, path, flags, 0, RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS)
        if fd is not None:
            return fd
        # Without openat2 (before 5.6): the sockets' walk, its last fd reopened.
        found = resolve_in_root(root_fd, path, checked=False)
        if not isinstance(found, Resolved):
            return None
        try:
            return os.open(f"/proc/self/fd/{found.fd}", flags | os.O_CLOEXEC)
        finally:
            os.close(found.fd)
    except (OSError, ValueError):
        return None
    finally:
        os.close(root_fd)


def _endpoint_in_file(pid_fd: int, path: str) -> str | None:
    """endpoint_in_config of a kubelet's config file, read in its root."""
    fd = _open_in_root(pid_fd, path, os.O_RDONLY | os.O_NONBLOCK)
    text = None if fd is None else _read_fd(fd, MAX_KUBELET_CONFIG)
    return endpoint_in_config(text.decode("utf-8", "replace")) if text else None


def _identity(path: str, dir_fd: int | None = None) -> tuple[int, int]:
    st = os.stat(path, dir_fd=dir_fd)
    return st.st_dev, st.st_ino


class Host(Struct, frozen=True):
    """The host as pid 1 sees it: its root directory and mount namespace, by (device, inode)."""

    root: tuple[int, int]
    mnt: tuple[int, int]


def host_of(proc: str) -> Host | str:
    """pid 1's root and mount namespace, or why they cannot be known (then no process is believed)."""
    try:
        return Host(_identity(f"{proc}/1/root"), _identity(f"{proc}/1/ns/mnt"))
    except OSError as err:
        return f"the host's init (pid 1) cannot be inspected ({err.strerror}), so no kubelet is believed"


def _uids(status: bytes) -> tuple[str, ...]:
    for line in status.splitlines():
        if line.startswith(b"Uid:"):
            return tuple(x.decode("ascii", "replace") for x in line.split()[1:])
    return ()


def distrust(pid_fd: int, host: Host | str) -> str | None:
    """Why the process whose /proc dir is `pid_fd` is not the node's kubelet; None when it is
    believed. Every look goes through that fd, so a reused pid is never looked at in its place."""
    if isinstance(host, str):
        return host
    try:
        if _identity("ns/mnt", pid_fd) != host.mnt:
            return "it runs in another mount namespace than the host's (pid 1)"
        if _identity("root", pid_fd) != host.root:
            return "its root directory is not the host's (pid 1)"
        exe = os.stat("exe", dir_fd=pid_fd)
        uids = _uids(_read("status", MAX_STATUS, pid_fd) or b"")
    except OSError as err:
        return f"it cannot be inspected ({err.strerror})"
    if len(uids) < 2 or uids[0] != "0" or uids[1] != "0":
        return "it does not run as root"
    if not stat.S_ISREG(exe.st_mode) or exe.st_uid != 0 or exe.st_mode & 0o022:
        mode = f"{exe.st_mode & 0o7777:o}"
        return f"its executable is not a file owned by root that only root may write (uid {exe.st_uid}, mode {mode})"
    return None


def processes_named(proc: str, comm: bytes) -> Iterator[tuple[int, int]]:
    """(pid, fd of its /proc dir) of every process named `comm`; the caller closes the fd."""
    try:
        entries = [entry for entry in os.listdir(proc) if entry.isdigit()]
    except OSError:
        return
    for entry in entries:
        try:
            pid_fd = os.open(f"{proc}/{entry}", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except OSError:
            continue  # gone
        if (_read("comm", 64, pid_fd) or b"").strip() == comm:
            yield int(entry), pid_fd
        else:
            os.close(pid_fd)


def _argv(pid_fd: int) -> list[str]:
    raw = _read("cmdline", MAX_CMDLINE, pid_fd)
    return [a.decode("utf-8", "replace") for a in raw.split(b"\0") if a] if raw else []


def believed_command_lines(proc: str, comm: bytes) -> list[tuple[int, list[str]]]:
    """(pid, argv) of each process named `comm` that `distrust` believes, by pid; another's
    flags would name the dirs for the node."""
    host = host_of(proc)
    found = []
    for pid, pid_fd in processes_named(proc, comm):
        try:
            if distrust(pid_fd, host) is None:
                argv = _argv(pid_fd)
                if argv:
                    found.append((pid, argv))
        finally:
            os.close(pid_fd)
    return sorted(found)


def _drop_in_endpoint(pid_fd: int, directory: str) -> str | None:
    """The last `containerRuntimeEndpoint` of the kubelet's `--config-dir` drop-ins (files
    ending .conf, merged in lexical order over --config), in its own root."""
    dir_fd = _open_in_root(pid_fd, directory, os.O_RDONLY | os.O_DIRECTORY)
    if dir_fd is None:
        return None
    found = None
    try:
        for name in sorted(os.listdir(dir_fd))[:MAX_DROP_INS]:
            if name.endswith(".conf"):
                found = _endpoint_in_file(pid_fd, f"{directory.rstrip('/')}/{name}") or found
    except OSError:
        return found
    finally:
        os.close(dir_fd)
    return found


def kubelet_endpoints(proc: str = "/proc") -> list[Endpoint]:
    """The endpoint each process named kubelet is configured with: its flag, else its
    `--config-dir` drop-ins', else its config file's; `refused` says why one is not believed."""
    host = host_of(proc)
    found = []
    for pid, pid_fd in processes_named(proc, b"kubelet"):
        try:
            why = distrust(pid_fd, host)
            argv = _argv(pid_fd)
            if not argv:
                continue
            value = flag_value(argv, _ENDPOINT_FLAG)
            source = f"kubelet (pid {pid}) {_ENDPOINT_FLAG}"
            if value is None:
                config = flag_value(argv, "--config") or KUBELET_CONFIG_DEFAULT
                value = _endpoint_in_file(pid_fd, config) if config.startswith("/") else None
                source = f"kubelet (pid {pid}) config {config}"
                drop_ins = flag_value(argv, "--config-dir")
                dropped = _drop_in_endpoint(pid_fd, drop_ins) if drop_ins and drop_ins.startswith("/") else None
                if dropped is not None:
                    value, source = dropped, f"kubelet (pid {pid}) config dir {drop_ins}"
        finally:
            os.close(pid_fd)
        url = as_url(value) if value else None
        if url is not None:
            found.append(Endpoint(url, source, refused=f"not asked: {why}" if why else None))
    return found


def open_socket(path: str, root: str | None = None) -> tuple[int, tuple[int, int]] | None:
    """checked_socket's fd and (device, inode) when it is a socket; None otherwise."""
    found = checked_socket(path, root)
    return (found.fd, found.key) if isinstance(found, Resolved) else None


def discover(proc: str = "/proc", known: tuple[tuple[str, str], ...] = KNOWN_SOCKETS) -> list[Endpoint]:
    """Every known socket (`known`: runtime name, path) that exists, then each believed
    kubelet's endpoint that is another socket, each with `fd` or `unaskable`; then each
    endpoint not believed (`refused`). The caller closes the fds (close_all)."""
    seen: set[tuple[int, int]] = set()
    out: list[Endpoint] = []
    refused: list[Endpoint] = []

    def add(endpoint: Endpoint, root: str | None, *, absent: str | None = None) -> None:
        found = checked_socket(endpoint.path, root)
        if found is None:
            if absent is not None:  # a believed kubelet's runtime, with no socket where it says
                out.append(Endpoint(endpoint.url, endpoint.source, unaskable=absent))
            return
        if found.key in seen:
            if isinstance(found, Resolved):
                os.close(found.fd)  # one socket found twice (/run and /var/run are usually one): the first stays
            return
        seen.add(found.key)
        if isinstance(found, Unfollowed):
            why = f"could not be asked: {found.reason}; fix that path or, {NAME_THEM}"
            out.append(Endpoint(endpoint.url, endpoint.source, unaskable=why))
        else:
            out.append(Endpoint(endpoint.url, endpoint.source, fd=found.fd))

    try:
        for name, path in known:
            add(Endpoint(UNIX + path, f"known socket ({name})"), None)
        for endpoint in kubelet_endpoints(proc):
            if endpoint.refused is not None:
                refused.append(endpoint)
            else:
                absent = f"could not be asked: the kubelet names it and there is no socket there; {NAME_THEM}"
                add(endpoint, f"{proc}/1/root", absent=absent)
    except BaseException:
        close_all(out)
        raise
    return out + refused
