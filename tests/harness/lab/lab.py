"""Lab: a private containerd + CNI setup for tests, and its complete teardown.

One Lab is one set of private namespaces, dirs and names (a random suffix), so two labs can run
side by side. Everything the lab starts or makes is found again and removed by ``close()``:
containerd, its shims and pause processes, every netns pin, the lab netns (which takes the
bridge, the veths and the iptables rules with it), the sandbox cgroups and the root dir.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import signal
import subprocess
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Literal

from reaper.runtime.client import CriError
from tests.harness.cri import api_pb2 as pb
from tests.harness.lab import cni, kernel, runtime
from tests.harness.lab.cni import ChainExtra, Leak, NetworkMode, NetworkSpec, PortMap
from tests.harness.lab.cri import LabRuntimeClient
from tests.harness.lab.image import DEFAULT_CACHE_DIR, PAUSE_IMAGE, build_pause_image

SYSTEM_CNI_BIN = Path("/usr/lib/cni")
# Optional knob for checking by hand against other plugin binaries (a newer release unpacked
# from a distribution's package): the dir the lab's bin dir links its plugins from.
CNI_BIN_ENV = "REAPER_LAB_CNI_BIN"


def system_cni_bin() -> Path:
    return Path(os.environ.get(CNI_BIN_ENV) or SYSTEM_CNI_BIN)


RUN_NETNS = Path("/run/netns")

_PROTOCOLS = {"tcp": pb.TCP, "udp": pb.UDP, "sctp": pb.SCTP}


class LabError(Exception):
    """The lab could not be set up, or a lab operation failed."""


class LabTeardownError(LabError):
    """close() could not undo everything; the message lists what is left."""


@dataclass(frozen=True)
class PodAttempt:
    """The outcome of one RunPodSandbox: the sandbox (found by its uid when the call failed)
    and the CRI error, if any."""

    name: str
    namespace: str
    uid: str
    sandbox_id: str | None
    error: str | None

    @property
    def ok(self) -> bool:
        return self.error is None


def _run(argv: Sequence[str], timeout: float = 30.0) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout, check=False)
    if proc.returncode != 0:
        raise LabError(f"{' '.join(argv)} failed ({proc.returncode}): {proc.stderr.strip()}")
    return proc


class Lab:
    """A containerd in its own netns and mount namespace, with a private CNI setup.

    Use as a context manager; ``start()``/``close()`` are also public. Every path and name is
    unique to the instance (see the properties).
    """

    def __init__(
        self,
        *,
        network_name: str | None = None,
        subnet: str | None = None,
        image_cache_dir: Path = DEFAULT_CACHE_DIR,
        initial_network: NetworkMode = "normal",
        chain_extras: Sequence[ChainExtra] = (),
        cri_timeout: float = 30.0,
        log_level: str = "info",
    ) -> None:
        suffix = secrets.token_hex(3)
        self._suffix = suffix
        self._root = Path(f"/tmp/reaperlab-{suffix}")
        self._netns_name = f"reaperlab-{suffix}"
        self._bridge = f"rl{suffix}0"
        self._network_name = network_name or f"reaperlab-{suffix}"
        self._subnet = subnet or f"10.123.{int(suffix[:2], 16)}.0/24"
        self._image_cache_dir = image_cache_dir
        self._initial_network: NetworkMode = initial_network
        self._cri_timeout = cri_timeout
        self._layout = runtime.ContainerdLayout(
            root=self._root,
            netns_path=RUN_NETNS / self._netns_name,
            sandbox_image=PAUSE_IMAGE,
            bin_dir=self._root / "bin",
            conf_dir=self._root / "net.d",
            log_level=log_level,
        )
        self._spec = NetworkSpec(
            name=self._network_name,
            bridge=self._bridge,
            subnet=self._subnet,
            ipam_dir=self.ipam_dir,
            extras=tuple(chain_extras),
        )
        self._proc: subprocess.Popen[bytes] | None = None
        self._client: LabRuntimeClient | None = None
        self._made_run_netns = False
        self._created_root = False
        self._started = False
        self._closed = False

    # ----------------------------------------------------------------- properties
    @property
    def root(self) -> Path:
        return self._root

    @property
    def netns_name(self) -> str:
        return self._netns_name

    @property
    def netns_path(self) -> Path:
        """The lab netns: containerd, the bridge, host veths and iptables rules live there."""
        return self._layout.netns_path

    @property
    def netns_dir(self) -> Path:
        """Where pod netns pins live (containerd's, and the leak generator's)."""
        return self._layout.netns_dir

    @property
    def cache_dir(self) -> Path:
        """The libcni cache dir containerd writes to (entries under cache_dir/results)."""
        return self._layout.varlib / "cni"

    @property
    def ipam_dir(self) -> Path:
        """host-local dataDir; leases are under ipam_dir/<network_name>/."""
        return self._root / "ipam"

    @property
    def conf_dir(self) -> Path:
        return self._layout.conf_dir

    @property
    def bin_dir(self) -> Path:
        return self._layout.bin_dir

    def plugin_call(
        self,
        container_id: str,
        pin: Path,
        command: Literal["ADD", "DEL"] = "ADD",
        cni_args: tuple[tuple[str, str], ...] | None = None,
    ) -> cni.PluginCall:
        """One plugin invocation as the lab's runtime makes it: in the lab's netns, from its bin
        dir, on eth0 of the netns pinned at `pin`; `cni_args` default to a pod no runtime lists."""
        args = cni_args or (
            ("IgnoreUnknown", "1"),
            ("K8S_POD_NAMESPACE", "default"),
            ("K8S_POD_NAME", f"gone-{container_id[:6]}"),
        )
        return cni.PluginCall(
            command=command,
            container_id=container_id,
            netns=str(pin),
            ifname=cni.IFNAME,
            cni_args=args,
            bin_dir=self.bin_dir,
            exec_netns=self.netns_path,
        )

    def install_plugin(self, name: str, script: str) -> Path:
        """A plugin of the test's own in the bin dir, as `name` (0755)."""
        plugin = self.bin_dir / name
        plugin.write_text(script)
        plugin.chmod(0o755)
        return plugin

    @property
    def endpoint(self) -> str:
        return self._layout.endpoint

    @property
    def network_name(self) -> str:
        return self._network_name

    @property
    def bridge(self) -> str:
        return self._bridge

    @property
    def subnet(self) -> str:
        return self._subnet

    @property
    def cgroup_parent(self) -> str:
        """The cgroup parent of every sandbox this lab runs (removed on close)."""
        return f"/reaperlab-{self._suffix}"

    @property
    def containerd_pid(self) -> int | None:
        """containerd's pid, None while the runtime is stopped."""
        proc = self._proc
        return proc.pid if proc is not None and proc.poll() is None else None

    @property
    def containerd_log(self) -> Path:
        return self._layout.log_path

    @property
    def network_spec(self) -> NetworkSpec:
        return self._spec

    # ----------------------------------------------------------------- lifecycle
    def __enter__(self) -> Lab:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def start(self) -> None:
        if self._started:
            raise LabError("a Lab starts once; make a new Lab")
        self._started = True
        try:
            self._setup()
        except BaseException:
            with contextlib.suppress(LabTeardownError):  # the setup error is the one to report
                self.close()
            raise

    def _setup(self) -> None:
        image = build_pause_image(self._image_cache_dir)
        os.mkdir(self._root, 0o755)
        self._created_root = True
        for d in (self.ipam_dir, self.conf_dir, self.bin_dir):
            d.mkdir(parents=True, exist_ok=True)
        self._populate_bin_dir()

        self._made_run_netns = not RUN_NETNS.exists()
        _run(["ip", "netns", "add", self._netns_name])
        _run(["ip", "-n", self._netns_name, "link", "set", "lo", "up"])

        runtime.prepare(self._layout)
        # The pin dir is a shared mount: pins containerd makes in its private mount namespace
        # propagate to this (the host's) namespace, and pins made here propagate to it.
        kernel.make_shared_bind(self.netns_dir)
        self._write_network(self._initial_network)

        self.start_runtime()
        self._ctr_import(image)
        self._wait_network(self._initial_network)

    def _ctr_import(self, image: Path) -> None:
        ctr = shutil.which("ctr", path=runtime.runtime_path()) or "ctr"  # the lab containerd's own
        _run([ctr, "--address", str(self._layout.socket), "-n", "k8s.io", "images", "import", str(image)])

    def _populate_bin_dir(self) -> None:
        for plugin in sorted(system_cni_bin().iterdir()):
            (self.bin_dir / plugin.name).symlink_to(plugin)
        fail = self.bin_dir / cni.FAIL_PLUGIN
        fail.write_text(cni.FAIL_PLUGIN_SCRIPT)
        fail.chmod(0o755)

    def start_runtime(self, timeout: float = 20.0) -> None:
        """Start containerd (again) with the lab's config, root and state; wait for CRI."""
        if self._proc is not None and self._proc.poll() is None:
            raise LabError(f"containerd already running as pid {self._proc.pid}")
        self._proc = runtime.start(self._layout)
        runtime.wait_ready(self._layout, self._proc, timeout)

    def stop_runtime(self, timeout: float = 10.0) -> None:
        """Stop containerd by its pid (SIGTERM, then SIGKILL). Shims and pods keep running."""
        if self._client is not None:
            self._client.close()
            self._client = None
        proc = self._proc
        if proc is None:
            return
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout)
        self._proc = None

    def forget_runtime_state(self) -> None:
        """The runtime loses its state (a wiped root, a node moved to another runtime): stop
        containerd, kill every shim and pause, wipe its root and state but keep the netns pins,
        the IPAM dir, the CNI cache and the lab netns; start it again. Whatever its sandboxes
        held is then held by nobody, which is what the reaper is for."""
        self.stop_runtime()
        self._kill_lab_processes()
        shutil.rmtree(self._layout.data_root, ignore_errors=True)
        keep = self.netns_dir
        for path in sorted(self._layout.state.rglob("*"), key=lambda p: -len(p.parts)):
            if path == keep or keep in path.parents or path in keep.parents:
                continue
            if path.is_dir() and not path.is_symlink():
                path.rmdir()
            else:
                path.unlink()
        run_dir = self._root / "run"
        if run_dir.is_dir():
            for child in run_dir.iterdir():
                if child.is_dir() and not child.is_symlink():
                    shutil.rmtree(child, ignore_errors=True)
                else:
                    child.unlink()
        self.start_runtime()
        image = build_pause_image(self._image_cache_dir)
        self._ctr_import(image)
        self._wait_network("normal" if any(self.conf_dir.iterdir()) else "empty")

    def close(self) -> None:
        """Undo everything the lab did. Idempotent; safe after a partial start."""
        if self._closed:
            return
        self._closed = True
        problems: list[str] = []

        def step(what: str, action: Callable[[], object]) -> None:
            try:
                action()
            except Exception as err:  # teardown goes on, then reports what is left
                problems.append(f"{what}: {err}")

        step("stop containerd", self.stop_runtime)
        step("kill lab processes", self._kill_lab_processes)
        step("unmount", lambda: kernel.unmount_all_under(self._root))
        step("delete lab netns", self._delete_netns)
        step("remove cgroups", self._remove_cgroups)
        step("remove root", self._remove_root)
        step("remove /run/netns", self._remove_run_netns)
        if problems:
            raise LabTeardownError("lab teardown incomplete: " + "; ".join(problems))

    def processes(self) -> set[int]:
        """Live processes of the lab: in its netns or a pod netns pinned in its netns dir, or
        started by its containerd (the lab root in the environment, its socket in the command
        line). containerd, shims, pause, and whatever a test ran in the lab netns."""
        ns_ids: set[kernel.NsId] = set()
        for path in [self.netns_path, *self._pins()]:
            ident = kernel.ns_id(path) if kernel.is_nsfs(path) else None
            if ident is not None:
                ns_ids.add(ident)
        # A test may pin the host's own netns in the pin dir: never treat it as the lab's.
        ns_ids -= {kernel.ns_id("/proc/1/ns/net"), kernel.ns_id("/proc/self/ns/net")}
        marker = f"REAPERLAB_ROOT={self._root}"
        me = os.getpid()
        found: set[int] = set()
        for pid in kernel.pids():
            if pid == me or not kernel.alive(pid):
                continue
            if (
                kernel.ns_id(f"/proc/{pid}/ns/net") in ns_ids
                or marker in kernel.read_environ(pid)
                or str(self._layout.socket) in kernel.read_cmdline(pid)
            ):
                found.add(pid)
        return found

    def _kill_lab_processes(self) -> None:
        """SIGKILL the lab's processes, leaves of the process tree first: a pause process is
        then reaped by its still-living shim instead of lingering as a zombie of PID 1."""
        left: list[int] = []
        for _ in range(10):
            victims = self.processes()
            if not victims:
                return
            parents = {kernel.parent_pid(pid) for pid in victims}
            leaves = [pid for pid in victims if pid not in parents] or sorted(victims)
            kernel.kill_all(leaves)
            left = kernel.wait_gone(leaves, timeout=5.0)
        raise LabError(f"processes still alive: {sorted(left or self.processes())}")

    def _pins(self) -> list[Path]:
        try:
            return sorted(p for p in self.netns_dir.iterdir())
        except OSError:
            return []

    def _delete_netns(self) -> None:
        if (RUN_NETNS / self._netns_name).exists():
            _run(["ip", "netns", "del", self._netns_name])

    def _remove_cgroups(self) -> None:
        name = self.cgroup_parent.strip("/")
        for entry in kernel.mountinfo():
            if entry.fstype not in ("cgroup", "cgroup2"):
                continue
            top = Path(entry.mount_point) / name
            if not top.is_dir():
                continue
            dirs = sorted((p for p in top.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts))
            for d in [*dirs, top]:
                for _ in range(50):  # a just-killed task may still be leaving the cgroup
                    try:
                        d.rmdir()
                        break
                    except FileNotFoundError:
                        break
                    except OSError:
                        time.sleep(0.02)
                else:
                    d.rmdir()

    def _remove_root(self) -> None:
        if not self._created_root or not self._root.exists():
            return
        left = kernel.mounts_under(self._root)
        if left:
            raise LabError(f"mounts left under {self._root}: {[m.mount_point for m in left]}")
        shutil.rmtree(self._root)

    def _remove_run_netns(self) -> None:
        """Undo what the first `ip netns add` did to a machine that had no /run/netns."""
        if not self._made_run_netns or not RUN_NETNS.is_dir() or any(RUN_NETNS.iterdir()):
            return
        if any(m.mount_point == str(RUN_NETNS) for m in kernel.mountinfo()):
            kernel.umount(str(RUN_NETNS))
        RUN_NETNS.rmdir()

    # ----------------------------------------------------------------- CRI
    @property
    def client(self) -> LabRuntimeClient:
        if self._client is None:
            self._client = LabRuntimeClient(self.endpoint, timeout=self._cri_timeout)
        return self._client

    def sandboxes(self) -> list[pb.PodSandbox]:
        return self.client.pb_sandboxes()

    def pod_status(self, sandbox_id: str) -> pb.PodSandboxStatusResponse:
        return self.client.pb_status(sandbox_id)

    def runtime_info(self) -> dict[str, str]:
        """CRI Status(verbose) info of the lab's containerd (cniconfig, lastCNILoadStatus, ...)."""
        return runtime.runtime_status_info(self.endpoint, self._cri_timeout)

    def pod_config(
        self,
        name: str,
        namespace: str = "default",
        port_mappings: Sequence[PortMap] = (),
        annotations: Mapping[str, str] | None = None,
    ) -> pb.PodSandboxConfig:
        return pb.PodSandboxConfig(
            metadata=pb.PodSandboxMetadata(name=name, uid=str(uuid.uuid4()), namespace=namespace, attempt=0),
            hostname=name,
            annotations=dict(annotations or {}),
            port_mappings=[
                pb.PortMapping(
                    protocol=_PROTOCOLS[p.protocol],
                    container_port=p.container_port,
                    host_port=p.host_port,
                    host_ip=p.host_ip,
                )
                for p in port_mappings
            ],
            linux=pb.LinuxPodSandboxConfig(cgroup_parent=self.cgroup_parent),
        )

    def try_run_pod(
        self,
        name: str,
        namespace: str = "default",
        port_mappings: Sequence[PortMap] = (),
        annotations: Mapping[str, str] | None = None,
    ) -> PodAttempt:
        """RunPodSandbox; on failure return the error and the (NOTREADY) sandbox it left."""
        config = self.pod_config(name, namespace, port_mappings, annotations)
        uid = config.metadata.uid
        try:
            sandbox_id: str | None = self.client.run_pod_sandbox(config)
            error: str | None = None
        except CriError as err:
            error = str(err)
            sandbox_id = next((s.id for s in self.sandboxes() if s.metadata.uid == uid), None)
        return PodAttempt(name=name, namespace=namespace, uid=uid, sandbox_id=sandbox_id, error=error)

    def run_pod(
        self,
        name: str,
        namespace: str = "default",
        port_mappings: Sequence[PortMap] = (),
        annotations: Mapping[str, str] | None = None,
    ) -> str:
        """RunPodSandbox; return the sandbox id, raise CriError with the runtime's message."""
        attempt = self.try_run_pod(name, namespace, port_mappings, annotations)
        if attempt.error is not None or attempt.sandbox_id is None:
            raise CriError(attempt.error or f"RunPodSandbox {name}: no sandbox id")
        return attempt.sandbox_id

    def stop_pod(self, sandbox_id: str) -> None:
        self.client.stop_pod_sandbox(sandbox_id)

    def remove_pod(self, sandbox_id: str) -> None:
        self.client.remove_pod_sandbox(sandbox_id)

    def pod_netns_path(self, sandbox_id: str) -> Path | None:
        """The sandbox's netns pin from PodSandboxStatus(verbose) info; None if host network."""
        raw = self.pod_status(sandbox_id).info.get("info")
        if not raw:
            return None
        info = json.loads(raw)
        meta_path = ((info.get("sandboxMetadata") or {}).get("Metadata") or {}).get("NetNSPath")
        if isinstance(meta_path, str) and meta_path:
            return Path(meta_path)
        namespaces = ((info.get("runtimeSpec") or {}).get("linux") or {}).get("namespaces") or []
        for ns in namespaces:
            if ns.get("type") == "network" and ns.get("path"):
                return Path(ns["path"])
        return None

    def pod_ip(self, sandbox_id: str) -> str:
        return self.pod_status(sandbox_id).status.network.ip

    # ----------------------------------------------------------------- network config
    def _conflist_path(self) -> Path:
        return self.conf_dir / f"10-{self._network_name}.conflist"

    def _write_network(self, mode: NetworkMode) -> None:
        for old in self.conf_dir.iterdir():
            if mode == "empty" or old != self._conflist_path():
                old.unlink()  # a Remove event: containerd reloads
        if mode == "empty":
            return
        # containerd 1.6 reloads its conf dir on Write, Rename and Remove events but ignores
        # Create, so a file renamed INTO the dir is never loaded. Stage it inside the dir under
        # a name libcni skips (.tmp), then rename: the Rename event of the staged name reloads,
        # and the new list is complete by then.
        staged = self.conf_dir / f".{self._conflist_path().name}.tmp"
        staged.write_bytes(self._spec.conflist_bytes(mode))
        os.replace(staged, self._conflist_path())

    def _wait_network(self, mode: NetworkMode, timeout: float = 15.0) -> None:
        expected = self._spec.conflist_bytes(mode).decode()
        deadline = time.monotonic() + timeout
        info: dict[str, str] = {}
        while time.monotonic() < deadline:
            info = self.runtime_info()
            loaded = runtime.loaded_cni_lists(info)
            status = info.get("lastCNILoadStatus", "")
            if mode == "empty" and status != "OK" and not any(self._network_name in s for s in loaded):
                return
            if mode != "empty" and status == "OK" and expected in loaded:
                return
            time.sleep(0.05)
        raise LabError(
            f"containerd did not load network mode {mode!r} within {timeout}s: "
            f"lastCNILoadStatus={info.get('lastCNILoadStatus')!r}"
        )

    def set_network(self, mode: NetworkMode) -> None:
        """Switch the CNI conf dir to ``mode`` and wait until containerd has reloaded it.

        normal: bridge (+ host-local) and portmap; empty: no config at all ("cni plugin not
        initialized"); failing: normal plus a last plugin that fails ADD and DEL.
        """
        self._write_network(mode)
        self._wait_network(mode)

    # ----------------------------------------------------------------- netns and leaks
    def run_in_netns(
        self, argv: Sequence[str], *, check: bool = False, timeout: float = 30.0, input: str | None = None
    ) -> subprocess.CompletedProcess[str]:
        """Run argv in the lab netns only (nsenter --net; the mount namespace stays the host's)."""
        return subprocess.run(
            ["nsenter", f"--net={self.netns_path}", *argv],
            capture_output=True,
            text=True,
            timeout=timeout,
            check=check,
            input=input,
        )

    def host_veth_of(self, netns_path: Path, ifname: str = cni.IFNAME) -> str | None:
        """The lab-netns end of the veth whose other end is ``ifname`` in ``netns_path``."""
        inner = subprocess.run(
            ["nsenter", f"--net={netns_path}", "ip", "-j", "link", "show", "dev", ifname],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
        if inner.returncode != 0:
            return None
        peer_index = json.loads(inner.stdout)[0].get("link_index")
        for link in json.loads(self.run_in_netns(["ip", "-j", "link", "show"], check=True).stdout):
            if link.get("ifindex") == peer_index:
                return str(link["ifname"])
        return None

    def make_pin(self, name: str | None = None) -> Path:
        """A fresh netns pinned in the lab's netns dir (containerd-like name by default)."""
        path = self.netns_dir / (name or f"cni-{uuid.uuid4()}")
        if path.parent != self.netns_dir or not path.name or path.name.startswith("."):
            raise LabError(f"bad pin name {name!r}")
        fd = os.open(path, os.O_RDONLY | os.O_CREAT | os.O_EXCL, 0o444)
        os.close(fd)
        try:
            _run(["unshare", f"--net={path}", "true"])
        except LabError:
            path.unlink()
            raise
        return path

    def make_leak(
        self,
        container_id: str | None = None,
        *,
        with_cache: bool = True,
        port_mappings: Sequence[PortMap] = (),
        pin_name: str | None = None,
        pod_name: str | None = None,
        pod_namespace: str = "default",
    ) -> Leak:
        """Attach a fresh pinned netns with the REAL plugins of the normal list, as containerd
        would, for a container ID the runtime never saw. with_cache writes the libcni cache
        entry that only a fully successful ADD leaves."""
        cid = container_id or secrets.token_hex(32)
        pin = self.make_pin(pin_name)
        conflist_bytes = self._spec.conflist_bytes("normal")
        conflist = json.loads(conflist_bytes)
        cni_args = (
            ("IgnoreUnknown", "1"),
            ("K8S_POD_NAMESPACE", pod_namespace),
            ("K8S_POD_NAME", pod_name or f"leak-{cid[:8]}"),
            ("K8S_POD_INFRA_CONTAINER_ID", cid),
            ("K8S_POD_UID", str(uuid.uuid4())),
        )
        caps = cni.containerd_capability_args(port_mappings)
        call = self.plugin_call(cid, pin, cni_args=cni_args)
        result = cni.add_network_list(conflist, call, caps)
        cache_path: Path | None = None
        if with_cache:
            entry = cni.cache_entry(
                container_id=cid,
                network=self._network_name,
                ifname=cni.IFNAME,
                conflist=conflist_bytes,
                cni_args=cni_args,
                capability_args=caps,
                result=result,
            )
            cache_path = cni.write_cache_entry(self.cache_dir, entry)
        ip = cni.result_ip(result)
        return Leak(
            container_id=cid,
            network=self._network_name,
            ifname=cni.IFNAME,
            netns_path=pin,
            ip=ip,
            host_veth=cni.result_host_veth(result, self._bridge),
            cache_path=cache_path,
            lease_path=self.ipam_dir / self._network_name / ip,
            masq_chain=cni.masq_chain(self._network_name, cid),
            port_mappings=tuple(port_mappings),
            result=result,
        )
