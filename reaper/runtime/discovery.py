"""Which CRI runtimes a node has: every known socket, and the kubelet's configured endpoint.

A node often has more than one CRI socket (Docker's containerd with CRI on beside CRI-O or
cri-dockerd, a leftover k3s, minikube); the reaper asks every one, so it is found, not
guessed.

Any process can name itself `kubelet`, so a process is believed only when the host's own
init (pid 1) could have started it as the node's kubelet: it runs as root, in pid 1's root
and mount namespace, from an executable file owned by root that no group or other user may
write. The endpoint of any other process called kubelet is reported and never asked: asking
it would let whoever runs it make every pass undecided, or answer for the node.

A socket is asked through the very file that was checked: it is opened `O_PATH | O_NOFOLLOW`
(a kubelet's path resolved in the host's root, as the kubelet resolves it), its inode read
from that fd, and the client connects to `/proc/self/fd/N`, which names that inode whatever
is renamed or swapped at the path afterwards. Sockets are told apart by that inode, the known
paths first: a kubelet's endpoint can only add a runtime, never stand in for a known socket.

Processes are read here through a descriptor of each one's /proc dir, not with psutil (which
the holders' descriptions use): the trust checks, the command line and the config read in the
process's root all go through that one fd, which keeps naming the process it was opened on. A
read by path (psutil's way) after the checks could land on another process that took the pid.
"""

from __future__ import annotations

import contextlib
import os
import re
import stat
from collections.abc import Iterable, Iterator

from msgspec import Struct

from reaper.host.confined import RESOLVE_IN_ROOT, RESOLVE_NO_MAGICLINKS, openat2

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
_CONFIG_FLAG = "--config"
_CONFIG_DIR_FLAG = "--config-dir"
MAX_DROP_INS = 256
_CONFIG_ENDPOINT = re.compile(r"""^containerRuntimeEndpoint:\s*["']?([^"'\s#]+)["']?\s*(?:#.*)?$""", re.MULTILINE)
_SOCKET_FLAGS = os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC


class Endpoint(Struct, frozen=True):
    url: str  # unix:///path
    source: str  # where it was found: "flag", "kubelet --container-runtime-endpoint", "known socket (cri-o)"
    # Why it is reported and not asked (the endpoint of a process that is not the node's kubelet).
    refused: str | None = None
    # An O_PATH fd of the socket file that was checked: what the client connects to. None: the
    # URL as given (--runtime-endpoint). Whoever made the Endpoint closes it (close_all).
    fd: int | None = None

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
    match = _CONFIG_ENDPOINT.search(text)
    if match:
        return match.group(1)
    json_match = re.search(r'"containerRuntimeEndpoint"\s*:\s*"([^"]+)"', text)
    return json_match.group(1) if json_match else None


def _read(path: str, limit: int, dir_fd: int | None = None) -> bytes | None:
    """At most `limit` bytes of a regular file (a config, a drop-in, /proc's cmdline); None for
    anything else, so a FIFO or a device planted under a config's name is never read from."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dir_fd)
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        return os.read(fd, limit)
    except OSError:
        return None
    finally:
        os.close(fd)


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
    believed. Every look goes through that dir's fd: a process that exits meanwhile makes the
    look fail (ESRCH), and a pid reused by another process is never looked at in its place."""
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
        entries = os.listdir(proc)
    except OSError:
        return
    for entry in entries:
        if not entry.isdigit():
            continue
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
    """(pid, argv) of each process named `comm` that the host's init could have started (see
    `distrust`), by pid; any other is left out: its flags would name the dirs for the node."""
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
    try:
        dir_fd = os.open("root" + directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC, dir_fd=pid_fd)
    except OSError:
        return None
    found = None
    try:
        for name in sorted(os.listdir(dir_fd))[:MAX_DROP_INS]:
            if name.endswith(".conf"):
                text = _read(name, MAX_KUBELET_CONFIG, dir_fd)
                found = (endpoint_in_config(text.decode("utf-8", "replace")) if text else None) or found
    except OSError:
        return found
    finally:
        os.close(dir_fd)
    return found


def kubelet_endpoints(proc: str = "/proc") -> list[Endpoint]:
    """The endpoint each process named kubelet is configured with: its flag, else its
    `--config-dir` drop-ins', else its config file's. One that is not believed (see
    `distrust`) has `refused` saying why."""
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
                config = flag_value(argv, _CONFIG_FLAG) or KUBELET_CONFIG_DEFAULT
                # In its own root (the host's, when it is believed); read within bounds either way.
                text = _read("root" + config, MAX_KUBELET_CONFIG, pid_fd) if config.startswith("/") else None
                value = endpoint_in_config(text.decode("utf-8", "replace")) if text else None
                source = f"kubelet (pid {pid}) config {config}"
                drop_ins = flag_value(argv, _CONFIG_DIR_FLAG)
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
    """The socket file at `path` (in `root`, a directory taken as "/", else this process's
    root) as an O_PATH fd, and its (device, inode); None when there is none (missing, a
    symlink, not a socket)."""
    try:
        if root is None:
            fd = os.open(path, _SOCKET_FLAGS)
        else:
            root_fd = os.open(root, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
            try:
                # Every step resolved with `root` as "/", symlinks included, as the kubelet sees it.
                opened = openat2(root_fd, path, _SOCKET_FLAGS, 0, RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS)
            finally:
                os.close(root_fd)
            # Without openat2 (kernels before 5.6) an absolute symlink on the way resolves in
            # this process's root: the same root where the reaper runs on the host itself.
            fd = opened if opened is not None else os.open(root + path, _SOCKET_FLAGS)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
    except OSError:
        os.close(fd)
        return None
    if not stat.S_ISSOCK(st.st_mode):
        os.close(fd)
        return None
    return fd, (st.st_dev, st.st_ino)


def discover(proc: str = "/proc", known: tuple[tuple[str, str], ...] = KNOWN_SOCKETS) -> list[Endpoint]:
    """Every known socket (`known`: runtime name, path) that exists, then each believed
    kubelet's endpoint that is another socket, each opened (`fd`); then each endpoint of a
    process that is not believed (`refused`, no fd). The caller closes the fds (close_all)."""
    seen: set[tuple[int, int]] = set()
    out: list[Endpoint] = []
    refused: list[Endpoint] = []

    def add(endpoint: Endpoint, root: str | None) -> None:
        opened = open_socket(endpoint.path, root)
        if opened is None:
            return  # no such socket here
        fd, key = opened
        if key in seen:
            os.close(fd)  # one socket found twice (/run and /var/run are usually one): the first stays
            return
        seen.add(key)
        out.append(Endpoint(endpoint.url, endpoint.source, fd=fd))

    try:
        for name, path in known:
            add(Endpoint(UNIX + path, f"known socket ({name})"), None)
        for endpoint in kubelet_endpoints(proc):
            if endpoint.refused is not None:
                refused.append(endpoint)
            else:
                add(endpoint, f"{proc}/1/root")
    except BaseException:
        close_all(out)
        raise
    return out + refused
