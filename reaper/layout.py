"""Where this node's runtimes keep CNI (conf, bin and netns dirs), read from their own configs and
command lines as each runtime reads them, so the reaper needs no flags on the nodes people run
(kubeadm, k3s, rke2, microk8s, Talos, CRI-O, cri-dockerd). Flags and REAPER_* variables always
win over what is detected here. Every runtime found counts: the layout is the union of their
dirs. Every path is read under `root` (a test's tree, or "/"). Which keys and files each runtime
reads: docs/design.md, "Layout detection".
"""

from __future__ import annotations

import glob
import os
import tomllib
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from msgspec import Struct

from reaper.host.confined import UnfitFile, read_admins
from reaper.runtime.discovery import believed_command_lines, flag_value

MAX_CONFIG_BYTES = 1 << 20
MAX_IMPORTS = 64
CONTAINERD_CRI = ("io.containerd.cri.v1.runtime", "io.containerd.grpc.v1.cri", "cri")
CRI_STATE_SUBDIR = "io.containerd.grpc.v1.cri"
DEFAULT_NETNS_DIR = "/var/run/netns"
CRIO_CONFIG = "/etc/crio/crio.conf"
CRIO_DROP_INS = "/etc/crio/crio.conf.d"


class ContainerdInstall(Struct, frozen=True):
    """Where one distribution's containerd keeps its config and state."""

    name: str
    config: str
    state: str  # --state: where CRI's netns dir is when mounts go under the state dir
    socket: str  # [grpc] address


_CONTAINERD_RUN = ("/run/containerd", "/run/containerd/containerd.sock")  # (state, socket)
_K3S_RUN = ("/run/k3s/containerd", "/run/k3s/containerd/containerd.sock")  # k3s' and rke2's
CONTAINERD_INSTALLS: tuple[ContainerdInstall, ...] = (
    ContainerdInstall("containerd", "/etc/containerd/config.toml", *_CONTAINERD_RUN),
    ContainerdInstall("k3s", "/var/lib/rancher/k3s/agent/etc/containerd/config.toml", *_K3S_RUN),
    ContainerdInstall("rke2", "/var/lib/rancher/rke2/agent/etc/containerd/config.toml", *_K3S_RUN),
    # Talos' CRI containerd: /etc/cri/containerd.toml, which imports what it merges in /etc/cri/conf.d.
    ContainerdInstall("talos", "/etc/cri/containerd.toml", *_CONTAINERD_RUN),
    ContainerdInstall(
        "microk8s",
        "/var/snap/microk8s/current/args/containerd.toml",
        "/var/snap/microk8s/common/run/containerd",
        "/var/snap/microk8s/common/run/containerd.sock",
    ),
)
CRIO_SOCKET = "/var/run/crio/crio.sock"
CRIO_RUNTIME = "cri-o"  # CRI-O's RuntimeLayout.runtime


class CriDockerdInstall(Struct, frozen=True, kw_only=True):
    """Where one cri-dockerd serves and which CNI dirs it is started with. It has no config
    file: it is there when its socket is."""

    name: str
    sockets: tuple[str, ...]
    conf_dir: str
    bin_dirs: tuple[str, ...]


# Docker makes the pins, whoever asks it: its netns dir, whatever cri-dockerd's CNI dirs are.
DOCKER_NETNS_DIR = "/var/run/docker/netns"
CRI_DOCKERD_INSTALLS: tuple[CriDockerdInstall, ...] = (
    # cri-dockerd's own defaults (--cni-conf-dir, --cni-bin-dir), its packaged systemd socket.
    CriDockerdInstall(
        name="cri-dockerd",
        sockets=("/run/cri-dockerd.sock", "/var/run/cri-dockerd.sock"),
        conf_dir="/etc/cni/net.d",
        bin_dirs=("/opt/cni/bin",),
    ),
    # k3s --docker runs cri-dockerd inside the agent with k3s' own CNI dirs.
    CriDockerdInstall(
        name="k3s --docker",
        sockets=("/run/k3s/cri-dockerd/cri-dockerd.sock",),
        conf_dir="/var/lib/rancher/k3s/agent/etc/cni/net.d",
        bin_dirs=("/var/lib/rancher/k3s/data/cni",),
    ),
)


class RuntimeLayout(Struct, frozen=True, kw_only=True):
    """One runtime's CNI dirs, as its own config says, and which files said so."""

    runtime: str
    conf_dir: str
    bin_dirs: tuple[str, ...]
    netns_dir: str
    sources: tuple[str, ...]
    socket: str  # where the runtime would serve CRI
    serving: bool  # that socket exists: the runtime is there, not only its config
    # containerd's per-runtime-handler conf dirs (Kata, gVisor: `containerd.runtimes.<name>.
    # cni_conf_dir`): a pod of that RuntimeClass is set up from that dir instead.
    handler_conf_dirs: tuple[str, ...] = ()


class Layout(Struct, frozen=True):
    # Those whose socket exists first: a config a runtime left behind says least.
    runtimes: tuple[RuntimeLayout, ...] = ()
    problems: tuple[str, ...] = ()  # configs found but not readable

    @property
    def conf_dir(self) -> str | None:
        """The first conf dir: its config wins for a network name that is in more than one."""
        return self.runtimes[0].conf_dir if self.runtimes else None

    @property
    def conf_dirs(self) -> tuple[str, ...]:
        """Every runtime's conf dir (and handler conf dirs), each once, in runtime order: each holds
        configs some runtime on this node would run, so all are the node's own."""
        return tuple(dict.fromkeys(d for r in self.runtimes for d in (r.conf_dir, *r.handler_conf_dirs)))

    @property
    def bin_dirs(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(d for r in self.runtimes for d in r.bin_dirs))

    @property
    def netns_dirs(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(r.netns_dir for r in self.runtimes))


class LayoutError(ValueError):
    """A runtime config that is there but cannot be read as its runtime reads it."""


def _read_toml(root: str, path: str) -> dict[str, Any]:
    # Links are followed as the runtime follows them (NixOS links all of /etc): the admin's files,
    # only read; a FIFO or a device is refused, and the size is bounded.
    try:
        return tomllib.loads(read_admins(_under(root, path), MAX_CONFIG_BYTES).decode("utf-8"))
    except (UnfitFile, UnicodeDecodeError, tomllib.TOMLDecodeError) as err:
        raise LayoutError(f"{path}: {err}") from None


def _under(root: str, path: str) -> str:
    return os.path.join(root, path.lstrip("/")) if root not in ("", "/") else path


def _table(doc: Mapping[str, Any], *keys: str) -> Mapping[str, Any]:
    node: Any = doc
    for key in keys:
        node = node.get(key) if isinstance(node, Mapping) else None
    return node if isinstance(node, Mapping) else {}


def _clean(path: Any) -> str | None:
    if isinstance(path, str) and path.startswith("/") and "\0" not in path:
        return os.path.normpath(path)
    return None


def _clean_all(paths: Iterable[Any]) -> tuple[str, ...]:
    return tuple(d for d in map(_clean, paths) if d is not None)


def _containerd_documents(root: str, config: str) -> Iterator[tuple[str, dict[str, Any]]]:
    """The config and the files it imports, breadth-first, each once (as containerd loads them)."""
    pending: list[str] = [config]
    seen: set[str] = set()
    while pending and len(seen) < MAX_IMPORTS:
        path = pending.pop(0)
        if path in seen:
            continue
        seen.add(path)
        doc = _read_toml(root, path)
        yield path, doc
        imports = doc.get("imports")
        for item in imports if isinstance(imports, list) else []:
            if not isinstance(item, str):
                continue
            target = item if item.startswith("/") else os.path.join(os.path.dirname(path), item)
            if "*" in target:
                base = _under(root, "/")
                matched = sorted(glob.glob(_under(root, target)))
                pending.extend("/" + os.path.relpath(m, base) if root not in ("", "/") else m for m in matched)
            else:
                pending.append(target)


class ContainerdFlags(Struct, frozen=True, kw_only=True):
    """What a believed containerd process's command line says: flags win over its config."""

    pid: int
    config: str | None  # --config, -c
    state: str | None  # --state
    address: str | None  # --address, -a


def _flag_path(argv: list[str], *flags: str) -> str | None:
    """The first of `flags` on the command line that gives a clean absolute path."""
    return next((v for v in (_clean(flag_value(argv, f)) for f in flags) if v is not None), None)


def containerd_flags(pid: int, argv: list[str]) -> ContainerdFlags:
    config, state = _flag_path(argv, "--config", "-c"), _flag_path(argv, "--state")
    return ContainerdFlags(pid=pid, config=config, state=state, address=_flag_path(argv, "--address", "-a"))


def containerd_layout(
    root: str, install: ContainerdInstall, flags: ContainerdFlags | None = None
) -> RuntimeLayout | None:
    """containerd's CNI dirs from its config (and its process's `flags`, which win); None when
    there is no such config file, or it disables the CRI plugin."""
    if not os.path.exists(_under(root, install.config)):
        return None
    conf_dir, under_state, state, socket = "/etc/cni/net.d", False, install.state, install.socket
    bin_dirs: tuple[str, ...] = ("/opt/cni/bin",)
    sources = []
    handlers: dict[str, str] = {}
    disabled: list[Any] = []
    for path, doc in _containerd_documents(root, install.config):
        sources.append(path)
        listed_off = doc.get("disabled_plugins")
        disabled = listed_off if isinstance(listed_off, list) else disabled
        state = _clean(doc.get("state")) or state
        socket = _clean(_table(doc, "grpc").get("address")) or socket
        for name in CONTAINERD_CRI:
            cri = _table(doc, "plugins", name)
            cni = _table(cri, "cni")
            conf_dir = _clean(cni.get("conf_dir")) or conf_dir
            listed = cni.get("bin_dirs")
            if isinstance(listed, list) and listed:
                bin_dirs = _clean_all(listed) or bin_dirs
            elif (single := _clean(cni.get("bin_dir"))) is not None:
                bin_dirs = (single,)
            if isinstance(cri.get("netns_mounts_under_state_dir"), bool):
                under_state = bool(cri["netns_mounts_under_state_dir"])
            for handler, table in _table(cri, "containerd", "runtimes").items():
                handler_dir = _clean(table.get("cni_conf_dir")) if isinstance(table, Mapping) else None
                if handler_dir is not None:
                    handlers[str(handler)] = handler_dir
    if any(name in disabled for name in CONTAINERD_CRI):
        # Docker's containerd (`disabled_plugins = ["cri"]`, as the containerd.io package
        # ships it) sets up no pod network: it has no CNI dirs to add.
        return None
    if flags is not None:
        state, socket = flags.state or state, flags.address or socket
        sources.append(f"containerd (pid {flags.pid}) command line")
    return RuntimeLayout(
        runtime=install.name,
        conf_dir=conf_dir,
        bin_dirs=bin_dirs,
        netns_dir=os.path.join(state, CRI_STATE_SUBDIR, "netns") if under_state else DEFAULT_NETNS_DIR,
        sources=tuple(sources),
        socket=socket,
        serving=os.path.exists(_under(root, socket)),
        handler_conf_dirs=tuple(dict.fromkeys(handlers[h] for h in sorted(handlers))),
    )


class CrioFlags(Struct, frozen=True, kw_only=True):
    """What a believed crio process's command line says: flags win over its files."""

    pid: int
    config: str  # --config, -c
    config_dir: str  # --config-dir, -d
    conf_dir: str | None  # --cni-config-dir
    bin_dirs: tuple[str, ...]  # --cni-plugin-dir, repeatable, each may hold several (comma)
    namespaces_dir: str | None  # --namespaces-dir
    listen: str | None  # --listen


def crio_flags(pid: int, argv: list[str]) -> CrioFlags:
    return CrioFlags(
        pid=pid,
        config=_flag_path(argv, "--config", "-c") or CRIO_CONFIG,
        config_dir=_flag_path(argv, "--config-dir", "-d") or CRIO_DROP_INS,
        conf_dir=_flag_path(argv, "--cni-config-dir"),
        bin_dirs=_comma_paths(argv, "--cni-plugin-dir"),
        namespaces_dir=_flag_path(argv, "--namespaces-dir"),
        listen=_flag_path(argv, "--listen"),
    )


def _crio_files(root: str, config: str = CRIO_CONFIG, config_dir: str = CRIO_DROP_INS) -> list[str]:
    files = [config] if os.path.isfile(_under(root, config)) else []
    drop_ins = _under(root, config_dir)
    for dirpath, dirnames, filenames in os.walk(drop_ins):
        dirnames.sort()
        for name in sorted(filenames):
            rel = os.path.relpath(os.path.join(dirpath, name), drop_ins)
            files.append(os.path.join(config_dir, rel))
    return files


def crio_layout(root: str, flags: CrioFlags | None = None) -> RuntimeLayout | None:
    """CRI-O's CNI dirs from crio.conf and its drop-ins, then its process's `flags`; None when
    it has neither config nor process here."""
    files = _crio_files(root) if flags is None else _crio_files(root, flags.config, flags.config_dir)
    if not files and flags is None:
        return None
    conf_dir, namespaces, socket = "/etc/cni/net.d", "/var/run", CRIO_SOCKET
    bin_dirs: tuple[str, ...] = ("/opt/cni/bin",)
    for path in files:
        doc = _read_toml(root, path)
        socket = _clean(_table(doc, "crio", "api").get("listen")) or socket
        network = _table(doc, "crio", "network")
        conf_dir = _clean(network.get("network_dir")) or conf_dir
        listed = network.get("plugin_dirs")
        if isinstance(listed, list):
            bin_dirs = _clean_all(listed) or bin_dirs
        single = _clean(network.get("plugin_dir"))
        if single is not None and single not in bin_dirs:
            bin_dirs += (single,)
        namespaces = _clean(_table(doc, "crio", "runtime").get("namespaces_dir")) or namespaces
    sources = list(files)
    if flags is not None:
        conf_dir, namespaces = flags.conf_dir or conf_dir, flags.namespaces_dir or namespaces
        bin_dirs, socket = flags.bin_dirs or bin_dirs, flags.listen or socket
        sources.append(f"crio (pid {flags.pid}) command line")
    return RuntimeLayout(
        runtime=CRIO_RUNTIME,
        conf_dir=conf_dir,
        bin_dirs=bin_dirs,
        netns_dir=os.path.join(namespaces, "netns"),
        sources=tuple(sources),
        socket=socket,
        serving=os.path.exists(_under(root, socket)),
    )


def _comma_paths(argv: list[str], flag: str) -> tuple[str, ...]:
    """Every path of a repeatable flag whose values may each list several, comma-separated."""
    found: list[str] = []
    for i, arg in enumerate(argv):
        value = arg.partition("=")[2] if arg.startswith(flag + "=") else None
        if arg == flag and i + 1 < len(argv):
            value = argv[i + 1]
        found += _clean_all((value or "").split(","))
    return tuple(dict.fromkeys(found))


def cri_dockerd_layout(
    root: str, install: CriDockerdInstall, argv: tuple[int, list[str]] | None = None
) -> RuntimeLayout | None:
    """cri-dockerd's CNI dirs when one of its sockets is here, else None; `argv` (pid, command line of
    the believed cri-dockerd process) has --cni-conf-dir and --cni-bin-dir that win."""
    socket = next((s for s in install.sockets if os.path.exists(_under(root, s))), None)
    if socket is None:
        return None
    conf_dir, bin_dirs, sources = install.conf_dir, install.bin_dirs, [socket]
    if argv is not None:
        pid, args = argv
        conf_dir = _clean(flag_value(args, "--cni-conf-dir")) or conf_dir
        bin_dirs = _comma_paths(args, "--cni-bin-dir") or bin_dirs
        sources.append(f"cri-dockerd (pid {pid}) command line")
    return RuntimeLayout(
        runtime=install.name,
        conf_dir=conf_dir,
        bin_dirs=bin_dirs,
        netns_dir=DOCKER_NETNS_DIR,
        sources=tuple(sources),
        socket=socket,
        serving=True,
    )


def _containerd_installs(proc: str | None) -> list[tuple[ContainerdInstall, ContainerdFlags | None]]:
    """The known installs, each with the flags of the believed containerd process that runs its
    config; and one more for each process whose --config is none of theirs."""
    installs: list[tuple[ContainerdInstall, ContainerdFlags | None]] = [(i, None) for i in CONTAINERD_INSTALLS]
    default = CONTAINERD_INSTALLS[0]
    for pid, argv in believed_command_lines(proc, b"containerd") if proc is not None else []:
        flags = containerd_flags(pid, argv)
        config = flags.config or default.config
        at = next((n for n, (i, f) in enumerate(installs) if i.config == config and f is None), None)
        if at is not None:
            installs[at] = (installs[at][0], flags)
        elif all(i.config != config for i, _ in installs):
            installs.append(
                (ContainerdInstall(f"containerd (pid {pid})", config, default.state, default.socket), flags)
            )
    return installs


def detect_layout(root: str = "/", proc: str | None = None) -> Layout:
    """Every runtime config on this node: containerd's installs, CRI-O, cri-dockerd's sockets, those
    serving first. With `proc` ("/proc"), the believed runtime processes' flags (reaper.runtime.
    discovery) win over the files, and a containerd's unknown --config is an install of its own."""
    found: list[RuntimeLayout] = []
    problems: list[str] = []
    crio = believed_command_lines(proc, b"crio") if proc is not None else []
    crio_flag = crio_flags(*crio[0]) if crio else None  # one CRI-O a node: the lowest pid
    for install, flags in (*_containerd_installs(proc), (None, None)):
        try:
            layout = containerd_layout(root, install, flags) if install is not None else crio_layout(root, crio_flag)
        except (LayoutError, OSError) as err:
            problems.append(str(err))
            continue
        if layout is not None:
            found.append(layout)
    dockerd = believed_command_lines(proc, b"cri-dockerd") if proc is not None else []
    for shim in CRI_DOCKERD_INSTALLS:
        # k3s --docker runs cri-dockerd inside its agent: no process of that name is its.
        own = dockerd[0] if dockerd and shim is CRI_DOCKERD_INSTALLS[0] else None
        shim_layout = cri_dockerd_layout(root, shim, own)
        if shim_layout is not None:
            found.append(shim_layout)
    found.sort(key=lambda r: not r.serving)  # stable: the fixed order within each group
    return Layout(tuple(found), tuple(problems))
