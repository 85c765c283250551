"""Real podman (Debian's 4.3, CNI backend) beside a lab's pods, as it shares a node with the
kubelet's runtime: its containers in the lab's netns, its libcni cache entries in the lab's
cache dir, its leases in the lab's IPAM dir, its netns pins in the lab's netns dir. Its own
storage, run and temp dirs are the lab's too, and every podman command runs in a mount
namespace of its own where the lab's dirs stand at /var/lib/cni and /run/netns, so nothing of
the host's is touched.
"""

from __future__ import annotations

import json
import secrets
import shlex
import shutil
import subprocess
import tarfile
from pathlib import Path

from tests.harness.lab import Lab

IMAGE = "localhost/reaper-busybox:1"
BUSYBOX = Path("/bin/busybox")  # Debian's busybox-static: a 2 MB rootfs
ULIMITS = ("--ulimit", "nofile=1024:1024", "--ulimit", "nproc=4096:4096")  # no CAP_SYS_RESOURCE here
NETWORK = "podman"  # podman's default network name, as on a real node


class PodmanError(Exception):
    pass


class LabPodman:
    def __init__(self, lab: Lab, subnet: str | None = None) -> None:
        self.lab = lab
        self.root = lab.root / "podman"
        self.bridge = f"cni-pm{secrets.token_hex(2)}"
        # A subnet of its own by default: a reap leaves an orphan whose address is configured in
        # any other netns on the machine, a parallel lab's podman containers' included.
        self.subnet = subnet or f"10.124.{secrets.randbelow(256)}.0/24"
        for sub in ("storage", "run", "tmp", "runc", "net.d", "rootfs/bin"):
            (self.root / sub).mkdir(parents=True, exist_ok=True)
        lab.cache_dir.mkdir(parents=True, exist_ok=True)  # containerd makes it at its first pod
        self._write_network()
        self._import_image()

    def _write_network(self) -> None:
        gateway = self.subnet.rsplit(".", 1)[0] + ".1"
        ipam = {
            "type": "host-local",
            "routes": [{"dst": "0.0.0.0/0"}],
            "ranges": [[{"subnet": self.subnet, "gateway": gateway}]],
            "dataDir": str(self.lab.ipam_dir),
        }
        # The plugin list of podman 4.3's default network (bridge, portmap, firewall, tuning).
        plugins = [
            {"type": "bridge", "bridge": self.bridge, "isGateway": True, "ipMasq": True, "hairpinMode": True,
             "ipam": ipam},
            {"type": "portmap", "capabilities": {"portMappings": True}},
            {"type": "firewall"},
            {"type": "tuning"},
        ]  # fmt: skip
        conflist = {"cniVersion": "0.4.0", "name": NETWORK, "plugins": plugins}
        (self.root / "net.d" / "87-podman-bridge.conflist").write_text(json.dumps(conflist))

    def _import_image(self) -> None:
        rootfs = self.root / "rootfs"
        shutil.copy2(BUSYBOX, rootfs / "bin" / "busybox")
        for applet in ("sh", "sleep"):
            (rootfs / "bin" / applet).unlink(missing_ok=True)
            (rootfs / "bin" / applet).symlink_to("busybox")
        archive = self.root / "rootfs.tar"
        with tarfile.open(archive, "w") as tar:
            tar.add(rootfs, arcname=".")
        self.podman("import", str(archive), IMAGE)

    def podman(self, *args: str, check: bool = True, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        base = [
            "podman", "--root", str(self.root / "storage"), "--runroot", str(self.root / "run"),
            "--tmpdir", str(self.root / "tmp"), "--cgroup-manager", "cgroupfs", "--events-backend", "file",
            "--network-backend", "cni", "--cni-config-dir", str(self.root / "net.d"), "--runtime", "runc",
            "--runtime-flag", f"root={self.root / 'runc'}",  # runc's state too, not the host's /run/runc
        ]  # fmt: skip
        argv = ["nsenter", f"--net={self.lab.netns_path}", *self.node_view(), *base, *args]
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
        if check and proc.returncode != 0:
            raise PodmanError(f"podman {' '.join(args)}: {proc.stderr.strip()[-800:]}")
        return proc

    def node_view(self) -> list[str]:
        """A command prefix: what follows runs in a mount namespace of its own that looks like the
        node podman believes it is on, the lab's netns dir at /run/netns and its cache dir at
        /var/lib/cni. The paths podman writes into its cache entries resolve there; the reaper
        under test is run the same way, as it would see them on such a node."""
        setup = [
            # Mounts made here on / or /run/netns must not reach the host's (both may be shared
            # there): this namespace's copies of them become private first. The lab's netns dir
            # stays shared with the host's, so the pins podman makes under /run/netns (its bind
            # here) show in the lab's netns dir everywhere.
            "mount --make-private /",
            "{ ! mountpoint -q /run/netns || mount --make-private /run/netns; }",
            "mkdir -p /run/netns",
            "mount -t tmpfs reaper-podman /var/lib",
            "mkdir -p /var/lib/cni",
            f"mount --bind {shlex.quote(str(self.lab.cache_dir))} /var/lib/cni",
            f"mount --rbind {shlex.quote(str(self.lab.netns_dir))} /run/netns",  # with the pins in it
            'exec "$@"',
        ]
        return ["unshare", "--mount", "--propagation", "unchanged", "sh", "-c", " && ".join(setup), "node-view"]

    def run(self, name: str) -> str:
        """A container that sleeps, on podman's network; its container ID."""
        out = self.podman("run", "-d", "--name", name, *ULIMITS, "--network", NETWORK, IMAGE, "sleep", "600")
        return out.stdout.strip().splitlines()[-1]

    def inspect(self, name: str) -> dict[str, object]:
        doc = json.loads(self.podman("inspect", name).stdout)[0]
        assert isinstance(doc, dict)
        return doc

    def ip(self, container_id: str) -> str:
        """The container's address, from its host-local lease (podman 4.3's inspect leaves the
        CNI network's address empty)."""
        for lease in (self.lab.ipam_dir / NETWORK).glob("10.*"):
            if lease.read_text().splitlines()[0].strip() == container_id:
                return lease.name
        raise AssertionError(f"no lease names {container_id[:12]}")

    def kill_hard(self, name: str) -> None:
        """The container and its conmon die without podman's cleanup (a node crash, an OOM
        kill): its pin, lease, cache entry and chains stay, and nothing is inside its netns."""
        state = self.inspect(name)["State"]
        assert isinstance(state, dict)
        for pid in (state["ConmonPid"], state["Pid"]):
            subprocess.run(["kill", "-9", str(pid)], check=False)

    def close(self) -> None:
        self.podman("rm", "-a", "-f", "-t", "0", check=False)
        self.podman("system", "reset", "-f", check=False)
        shutil.rmtree(self.root, ignore_errors=True)
