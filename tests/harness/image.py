"""The project's image, built by podman and run the way the Helm chart runs it.

podman keeps everything of its own under one test dir: storage, run root, temp dir, runc's state
and CNI config dir, and every podman command runs in a mount namespace of its own where /var/lib
is an empty tmpfs (podman keeps a blob cache under /var/lib/containers whatever --root says).
Nothing uses CNI: build steps share the host's network (`--network host`: a podman network
would put a bridge and firewall rules in the host's netns) and the agent runs in the lab's
netns (`--network ns:`), as the chart's agent runs in the node's.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tarfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.harness.lab import kernel

ROOT = Path(__file__).resolve().parents[2]
ULIMITS = ("--ulimit", "nofile=1024:1024", "--ulimit", "nproc=4096:4096")  # no CAP_SYS_RESOURCE here
# What RUN steps borrow from the host to reach the package index as the host does: its CA bundle
# and its site-wide pip config (cert, index, proxy). Not /etc/xdg/pip (a constraints file that
# names the host's own paths) nor root's ~/.config/pip (indexes in local dirs), nor the PIP_*
# variables (podman build passes no environment): they name files the build does not have.
# The pip config is lent as a file under a lent /root (pip's user config), never at
# /etc/pip.conf: a bind target that does not exist in the base is left in the layer as an empty
# file, and /root exists in every base.
CA_CERTS = Path("/etc/ssl/certs")
PIP_CONF = Path("/etc/pip.conf")

# Kubernetes mountPropagation -> the bind propagation that does the same.
PROPAGATION = {None: "rprivate", "None": "rprivate", "HostToContainer": "rslave", "Bidirectional": "rshared"}
# `reaper run` flags that `reaper reap` does not take.
RUN_ONLY_FLAGS = ("--mode", "--interval", "--listen", "--stall-after")


class PodmanError(Exception):
    pass


class PrivatePodman:
    def __init__(self, root: Path) -> None:
        self.root = root
        for sub in ("storage", "run", "tmp", "runc", "net.d"):
            (root / sub).mkdir(parents=True, exist_ok=True)

    def argv(self, *args: str) -> list[str]:
        setup = 'mount --make-private / && mount -t tmpfs cni-reaper-image /var/lib && exec "$@"'
        podman = [
            "podman", "--root", str(self.root / "storage"), "--runroot", str(self.root / "run"),
            "--tmpdir", str(self.root / "tmp"), "--cgroup-manager", "cgroupfs", "--events-backend", "file",
            "--network-backend", "cni", "--cni-config-dir", str(self.root / "net.d"),
            "--runtime", "runc", "--runtime-flag", f"root={self.root / 'runc'}",
        ]  # fmt: skip
        return ["unshare", "--mount", "--propagation", "unchanged", "sh", "-c", setup, "podman-private", *podman, *args]

    def env(self) -> dict[str, str]:
        return {**os.environ, "TMPDIR": str(self.root / "tmp")}

    def __call__(
        self, *args: str, check: bool = True, timeout: float = 120, stdin: int | None = None
    ) -> subprocess.CompletedProcess[str]:
        proc = subprocess.run(
            self.argv(*args), stdin=stdin, capture_output=True, text=True, timeout=timeout, check=False, env=self.env()
        )
        if check and proc.returncode != 0:
            raise PodmanError(f"podman {' '.join(args[:3])}...: {(proc.stdout + proc.stderr).strip()[-3000:]}")
        return proc

    def popen(self, *args: str, log: Path) -> subprocess.Popen[bytes]:
        with log.open("wb") as out:
            return subprocess.Popen(self.argv(*args), stdout=out, stderr=subprocess.STDOUT, env=self.env())

    def import_tree(self, rootfs: Path, tag: str) -> None:
        """`podman import` of a directory tree, streamed as a tar."""
        tar = subprocess.Popen(["tar", "-C", str(rootfs), "--numeric-owner", "-cf", "-", "."], stdout=subprocess.PIPE)
        assert tar.stdout is not None
        try:
            self("import", "-", tag, stdin=tar.stdout.fileno(), timeout=600)
        finally:
            tar.stdout.close()
            if tar.wait(120) != 0:
                raise PodmanError(f"tar of {rootfs} failed")

    def build(
        self, tag: str, base: str, home: Path, context: Path = ROOT, args: dict[str, str] | None = None
    ) -> subprocess.CompletedProcess[str]:
        lend = ["-v", f"{CA_CERTS}:{CA_CERTS}:ro"] if CA_CERTS.is_dir() else []
        lend += ["-v", f"{home}:/root:ro"]
        build_args = [f"--build-arg={name}={value}" for name, value in {"BASE": base, **(args or {})}.items()]
        return self(
            "build", "--pull=never", "--network", "host", *ULIMITS, *lend, *build_args,
            "-t", tag, str(context), timeout=1200,
        )  # fmt: skip

    def inspect(self, what: str) -> dict[str, Any]:
        doc: dict[str, Any] = json.loads(self("inspect", what).stdout)[0]
        return doc

    def layers(self, image: str) -> Iterator[tuple[str, tarfile.TarFile]]:
        """(diff ID, tar) of every layer of `image`, from `podman save` (docker-archive)."""
        archive = self.root / "tmp" / "image.tar"
        self("save", "--format", "docker-archive", "-o", str(archive), image, timeout=600)
        try:
            with tarfile.open(archive) as outer:
                manifest = json.load(_member(outer, "manifest.json"))[0]
                config = json.load(_member(outer, manifest["Config"]))
                for diff_id, name in zip(config["rootfs"]["diff_ids"], manifest["Layers"], strict=True):
                    with tarfile.open(fileobj=_member(outer, name)) as layer:
                        yield diff_id, layer
        finally:
            archive.unlink(missing_ok=True)

    def close(self) -> None:
        self("rm", "-a", "-f", "-t", "0", check=False)
        self("system", "reset", "-f", check=False, timeout=300)
        kernel.unmount_all_under(self.root)
        shutil.rmtree(self.root, ignore_errors=True)


def _member(tar: tarfile.TarFile, name: str) -> Any:
    f = tar.extractfile(name)
    assert f is not None, name
    return f


def lend_pip_home(home: Path) -> Path:
    """A dir to lend as /root during the build: the host's pip config as pip's user config."""
    (home / ".config" / "pip").mkdir(parents=True, exist_ok=True)
    if PIP_CONF.is_file():
        shutil.copy(PIP_CONF, home / ".config" / "pip" / "pip.conf")
    return home


# --- the chart's pod, as podman flags ------------------------------------------------------


@dataclass
class ChartPod:
    """What the chart's DaemonSet asks of the container runtime, for one rendered manifest."""

    container: dict[str, Any]
    pod: dict[str, Any]
    made: list[Path] = field(default_factory=list)  # host paths a hostPath type made; removed after

    @classmethod
    def from_manifests(cls, docs: Sequence[dict[str, Any]]) -> ChartPod:
        (ds,) = [d for d in docs if d["kind"] == "DaemonSet"]
        pod = ds["spec"]["template"]["spec"]
        (container,) = pod["containers"]
        return cls(container, pod)

    @property
    def args(self) -> list[str]:
        return list(self.container["args"])

    def reap_args(self) -> list[str]:
        """The chart's `reaper run` arguments as a `reaper reap`: its own flags, without the agent's."""
        return [arg for arg in self.args[1:] if arg.split("=", 1)[0] not in RUN_ONLY_FLAGS]

    def podman_flags(self, netns: Path, env: dict[str, str]) -> list[str]:
        """privileged, host PID, the read-only root with the chart's /tmp, the chart's host paths
        at their mount paths with their propagation, `netns` as the node's network."""
        security = self.container["securityContext"]
        assert self.pod["hostNetwork"] is True and self.pod["hostPID"] is True
        flags = ["--network", f"ns:{netns}", "--pid", "host", *ULIMITS]
        if security.get("privileged"):
            flags.append("--privileged")
        if "runAsUser" in security:
            flags += ["--user", f"{security['runAsUser']}:{security['runAsUser']}"]
        volumes = {v["name"]: v for v in self.pod["volumes"]}
        if security.get("readOnlyRootFilesystem"):
            flags += ["--read-only", "--read-only-tmpfs=false"]
        for mount in self.container["volumeMounts"]:
            volume = volumes[mount["name"]]
            if "emptyDir" in volume:
                size = volume["emptyDir"].get("sizeLimit", "16Mi").replace("Mi", "m")
                flags += ["--mount", f"type=tmpfs,destination={mount['mountPath']},tmpfs-size={size}"]
                continue
            host = volume["hostPath"]
            self._host_path(Path(host["path"]), host.get("type", ""))
            options = [
                "type=bind",
                f"source={host['path']}",
                f"destination={mount['mountPath']}",
                f"bind-propagation={PROPAGATION[mount.get('mountPropagation')]}",
            ]
            if mount.get("readOnly"):
                options.append("ro=true")
            flags += ["--mount", ",".join(options)]
        # A value may name a variable defined before it, `$(NODE_IP):9753`, which the kubelet
        # expands (the chart's REAPER_LISTEN); the variables given stand in for the downward API's.
        defined = dict(env)
        for var in self.container["env"]:
            name = var["name"]
            if name in env:
                flags += ["--env", f"{name}={env[name]}"]
            elif "value" in var:
                defined[name] = expand([var["value"]], defined)[0]
                flags += ["--env", f"{name}={defined[name]}"]
        return flags

    def _host_path(self, path: Path, kind: str) -> None:
        """The kubelet's hostPath types: make what *OrCreate asks for, insist on what exists."""
        if path.exists():
            return
        if kind == "DirectoryOrCreate":
            missing = [p for p in [path, *path.parents] if not p.exists()]
            path.mkdir(parents=True)
            self.made.extend(missing)  # deepest first
        elif kind == "FileOrCreate":
            missing = [p for p in path.parents if not p.exists()]
            path.parent.mkdir(parents=True, exist_ok=True)
            path.touch()
            self.made.extend([path, *missing])
        else:
            raise AssertionError(f"hostPath {path} ({kind or 'no type'}) does not exist")

    def remove_made(self) -> None:
        """Remove what _host_path made, deepest first; all of it, then say what could not be."""
        left = []
        for path in self.made:
            try:
                if path.is_dir() and not path.is_symlink():
                    path.rmdir()
                else:
                    path.unlink(missing_ok=True)
            except OSError as err:
                left.append(f"{path}: {err.strerror}")
        self.made.clear()
        assert not left, f"host paths made for the pod are left: {left}"


def expand(args: Sequence[str], env: dict[str, str]) -> list[str]:
    """Kubernetes' $(VAR) expansion in container args."""
    out = []
    for arg in args:
        expanded = arg
        for name, value in env.items():
            expanded = expanded.replace(f"$({name})", value)
        out.append(expanded)
    return out
