"""Which CRI runtimes a node has: the kubelet's configured endpoint, and every known socket.

A node often has more than one CRI socket (Docker's containerd with CRI on beside CRI-O or
cri-dockerd, a leftover k3s, minikube); the reaper asks every one, so it is found, not
guessed.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable

from msgspec import Struct

UNIX = "unix://"
# Where each runtime puts its CRI socket by default.
KNOWN_SOCKETS: tuple[tuple[str, str], ...] = (
    ("containerd", "/run/containerd/containerd.sock"),
    ("containerd", "/var/run/containerd/containerd.sock"),
    ("cri-o", "/run/crio/crio.sock"),
    ("cri-o", "/var/run/crio/crio.sock"),
    ("cri-dockerd", "/run/cri-dockerd.sock"),
    ("cri-dockerd", "/var/run/cri-dockerd.sock"),
    ("k3s/rke2", "/run/k3s/containerd/containerd.sock"),
    ("microk8s", "/var/snap/microk8s/common/run/containerd.sock"),
)
KUBELET_CONFIG_DEFAULT = "/var/lib/kubelet/config.yaml"
MAX_CMDLINE = 1 << 16
MAX_KUBELET_CONFIG = 1 << 20
_ENDPOINT_FLAG = "--container-runtime-endpoint"
_CONFIG_FLAG = "--config"
_CONFIG_ENDPOINT = re.compile(r"""^containerRuntimeEndpoint:\s*["']?([^"'\s#]+)["']?\s*(?:#.*)?$""", re.MULTILINE)


class Endpoint(Struct, frozen=True):
    url: str  # unix:///path
    source: str  # where it was found: "flag", "kubelet --container-runtime-endpoint", "known socket (cri-o)"

    @property
    def path(self) -> str:
        return socket_path(self.url)


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


def _read(path: str, limit: int) -> bytes | None:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        return os.read(fd, limit)
    except OSError:
        return None
    finally:
        os.close(fd)


def _kubelet_pids(proc: str) -> Iterable[int]:
    try:
        entries = os.listdir(proc)
    except OSError:
        return
    for entry in entries:
        if entry.isdigit() and (_read(f"{proc}/{entry}/comm", 64) or b"").strip() == b"kubelet":
            yield int(entry)


def kubelet_endpoints(proc: str = "/proc") -> list[Endpoint]:
    """The endpoint each running kubelet is configured with: its flag, else its config file's."""
    found = []
    for pid in _kubelet_pids(proc):
        raw = _read(f"{proc}/{pid}/cmdline", MAX_CMDLINE)
        if not raw:
            continue
        argv = [a.decode("utf-8", "replace") for a in raw.split(b"\0") if a]
        value = flag_value(argv, _ENDPOINT_FLAG)
        source = f"kubelet (pid {pid}) {_ENDPOINT_FLAG}"
        if value is None:
            config = flag_value(argv, _CONFIG_FLAG) or KUBELET_CONFIG_DEFAULT
            # Through the kubelet's own root: it may live in another mount namespace.
            text = _read(f"{proc}/{pid}/root{config}", MAX_KUBELET_CONFIG) if config.startswith("/") else None
            value = endpoint_in_config(text.decode("utf-8", "replace")) if text else None
            source = f"kubelet (pid {pid}) config {config}"
        url = as_url(value) if value else None
        if url is not None:
            found.append(Endpoint(url, source))
    return found


def discover(proc: str = "/proc") -> list[Endpoint]:
    """The kubelet's endpoints first, then every known socket that exists; each socket once."""
    candidates = kubelet_endpoints(proc)
    candidates += [Endpoint(UNIX + path, f"known socket ({name})") for name, path in KNOWN_SOCKETS]
    seen: set[tuple[int, int]] = set()
    out = []
    for endpoint in candidates:
        try:
            st = os.stat(endpoint.path)
        except OSError:
            continue  # no such socket here
        if (st.st_dev, st.st_ino) in seen:
            continue  # /run and /var/run are usually one
        seen.add((st.st_dev, st.st_ino))
        out.append(endpoint)
    return out
