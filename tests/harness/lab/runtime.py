"""containerd for one lab: its config, its start inside the lab's namespaces, and readiness."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from google.protobuf.message import Message

from reaper.runtime.client import CriError, RuntimeClient

NSEXEC = Path(__file__).with_name("nsexec.py")
_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

# Optional knob for checking by hand against another containerd (e.g. a newer release unpacked
# from a distribution's package): the containerd binary to run. Its directory goes first on the
# PATH of containerd (so its own shim comes along) and of `ctr`. Unset: `containerd` from PATH.
CONTAINERD_ENV = "REAPER_LAB_CONTAINERD"


def containerd_binary() -> str:
    return os.environ.get(CONTAINERD_ENV) or "containerd"


def runtime_path() -> str:
    """PATH for containerd, its shims and ctr: the knob's binary dir first, when set."""
    base = os.environ.get("PATH", _PATH)
    chosen = os.environ.get(CONTAINERD_ENV)
    return f"{Path(chosen).parent}:{base}" if chosen else base


def containerd_major() -> int:
    """The major version of the containerd the lab runs (1 when it cannot tell)."""
    try:
        out = subprocess.run(
            [containerd_binary(), "--version"], capture_output=True, text=True, timeout=30, check=False
        ).stdout
    except OSError:
        return 1
    for word in out.split():
        head = word.lstrip("v").split(".")[0]
        if "." in word and head.isdigit():
            return int(head)
    return 1


# Plugins a CRI lab never needs. io.containerd.runtime.v1.linux must stay: containerd 1.6's
# tasks service (and so CRI) refuses to load without a runtime v1 plugin registered.
_DISABLED_PLUGINS = (
    "io.containerd.internal.v1.opt",  # would create /opt/containerd on the host
    "io.containerd.snapshotter.v1.aufs",
    "io.containerd.snapshotter.v1.btrfs",
    "io.containerd.snapshotter.v1.devmapper",
    "io.containerd.snapshotter.v1.zfs",
    "io.containerd.tracing.processor.v1.otlp",
    "io.containerd.internal.v1.tracing",
)


class RuntimeStartError(Exception):
    """containerd did not come up; the message carries the tail of its log."""


@dataclass(frozen=True)
class ContainerdLayout:
    """Where one lab's containerd keeps everything (all under the lab root)."""

    root: Path
    netns_path: Path  # the lab netns containerd runs in
    sandbox_image: str
    bin_dir: Path
    conf_dir: Path
    log_level: str = "info"

    @property
    def config_path(self) -> Path:
        return self.root / "config.toml"

    @property
    def socket(self) -> Path:
        return self.root / "containerd.sock"

    @property
    def endpoint(self) -> str:
        return f"unix://{self.socket}"

    @property
    def data_root(self) -> Path:
        return self.root / "root"

    @property
    def state(self) -> Path:
        return self.root / "state"

    @property
    def netns_dir(self) -> Path:
        """Where the CRI plugin pins pod netns with netns_mounts_under_state_dir = true.

        containerd 1.6 uses the CRI plugin's own state dir, <state>/io.containerd.grpc.v1.cri/netns.
        """
        return self.state / "io.containerd.grpc.v1.cri" / "netns"

    @property
    def varlib(self) -> Path:
        """Mounted over /var/lib for containerd (its libcni cache lands in varlib/cni)."""
        return self.root / "varlib"

    @property
    def run(self) -> Path:
        """Mounted over /run for containerd (shim sockets, runc state: /run/containerd/...)."""
        return self.root / "run"

    @property
    def temp(self) -> Path:
        """containerd's temp dir (temporary mounts while unpacking), instead of /tmp."""
        return self.root / "tmp"

    @property
    def log_path(self) -> Path:
        return self.root / "containerd.log"


def _toml_str(value: str) -> str:
    return json.dumps(value)  # a JSON string is a valid TOML basic string for these paths


def _common(layout: ContainerdLayout, disabled: str) -> str:
    """What every config version of the lab says alike: its own dirs, socket, log level, and no
    TCP, debug or metrics listeners."""
    return f"""root = {_toml_str(str(layout.data_root))}
state = {_toml_str(str(layout.state))}
temp = {_toml_str(str(layout.temp))}
disabled_plugins = [{disabled}]

[grpc]
  address = {_toml_str(str(layout.socket))}
  tcp_address = ""

[ttrpc]
  address = {_toml_str(str(layout.socket) + ".ttrpc")}

[debug]
  address = ""
  level = {_toml_str(layout.log_level)}

[metrics]
  address = ""
"""


def render_config(layout: ContainerdLayout) -> str:
    if containerd_major() >= 2:
        return render_config_v3(layout)
    cri = '[plugins."io.containerd.grpc.v1.cri"'
    disabled = ", ".join(_toml_str(p) for p in _DISABLED_PLUGINS)
    return f"""# containerd config of a cni-reaper test lab (generated by tests/harness/lab/runtime.py)
version = 2
{_common(layout, disabled)}
{cri}]
  sandbox_image = {_toml_str(layout.sandbox_image)}
  restrict_oom_score_adj = true
  netns_mounts_under_state_dir = true
  disable_tcp_service = true
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  enable_selinux = false
  disable_apparmor = true

{cri}.cni]
  bin_dir = {_toml_str(str(layout.bin_dir))}
  conf_dir = {_toml_str(str(layout.conf_dir))}
  max_conf_num = 1

{cri}.containerd]
  default_runtime_name = "runc"
  snapshotter = "overlayfs"

{cri}.containerd.runtimes.runc]
  runtime_type = "io.containerd.runc.v2"

{cri}.containerd.runtimes.runc.options]
  SystemdCgroup = false
"""


def render_config_v3(layout: ContainerdLayout) -> str:
    """The same lab config for containerd 2.x (config version 3, the split CRI plugins)."""
    disabled = ", ".join(_toml_str(p) for p in (*_DISABLED_PLUGINS, "io.containerd.snapshotter.v1.erofs"))
    rt = "[plugins.'io.containerd.cri.v1.runtime'"
    return f"""# containerd 2.x config of a cni-reaper test lab (generated by tests/harness/lab/runtime.py)
version = 3
{_common(layout, disabled)}
[plugins.'io.containerd.cri.v1.images']
  snapshotter = "overlayfs"

[plugins.'io.containerd.cri.v1.images'.pinned_images]
  sandbox = {_toml_str(layout.sandbox_image)}

{rt}]
  restrict_oom_score_adj = true
  netns_mounts_under_state_dir = true
  enable_selinux = false
  disable_apparmor = true

{rt}.cni]
  bin_dirs = [{_toml_str(str(layout.bin_dir))}]
  conf_dir = {_toml_str(str(layout.conf_dir))}
  max_conf_num = 1

{rt}.containerd]
  default_runtime_name = "runc"

{rt}.containerd.runtimes.runc]
  runtime_type = "io.containerd.runc.v2"

{rt}.containerd.runtimes.runc.options]
  SystemdCgroup = false

[plugins.'io.containerd.grpc.v1.cri']
  disable_tcp_service = true
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
"""


def prepare(layout: ContainerdLayout) -> None:
    """Write the config and make the dirs containerd and the namespace helper need."""
    for d in (layout.data_root, layout.netns_dir, layout.varlib, layout.run, layout.temp):
        d.mkdir(parents=True, exist_ok=True)
    layout.config_path.write_text(render_config(layout))


def start(layout: ContainerdLayout) -> subprocess.Popen[bytes]:
    """Start containerd in the lab netns and a private mount namespace; return its process.

    nsenter (net only: `ip netns exec` would remount /sys and break runc) -> unshare --mount
    -> nsexec.py (private mounts, <root>/varlib over /var/lib, <root>/run over /run) -> exec
    containerd. Every step execs, so the returned pid is containerd's own. The process runs in
    its own session so a terminal's Ctrl-C does not reach it.
    """
    argv = [
        "nsenter",
        f"--net={layout.netns_path}",
        "unshare",
        "--mount",
        "--propagation",
        "unchanged",
        sys.executable,
        "-I",
        str(NSEXEC),
        "--keep-shared",
        str(layout.netns_dir),
        "--bind",
        f"{layout.varlib}:/var/lib",
        "--bind",
        f"{layout.run}:/run",
        "--",
        "containerd",  # found first in the knob's dir when set (runtime_path)
        "--config",
        str(layout.config_path),
    ]
    env = {"PATH": runtime_path(), "REAPERLAB_ROOT": str(layout.root)}
    with open(layout.log_path, "ab") as log:
        return subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=layout.root,
            env=env,
            start_new_session=True,
            close_fds=True,
        )


def log_tail(layout: ContainerdLayout, lines: int = 30) -> str:
    try:
        text = layout.log_path.read_text(errors="replace")
    except OSError:
        return ""
    return "\n".join(text.splitlines()[-lines:])


def wait_ready(layout: ContainerdLayout, proc: subprocess.Popen[bytes], timeout: float) -> None:
    """Wait for the socket and a successful CRI Version call."""
    deadline = time.monotonic() + timeout
    last = "socket not there yet"
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeStartError(f"containerd exited with {proc.returncode}; log:\n{log_tail(layout)}")
        if layout.socket.exists():
            try:
                with RuntimeClient(layout.endpoint, timeout=2.0) as client:
                    client.version()
                return
            except CriError as err:
                last = str(err)
        time.sleep(0.05)
    raise RuntimeStartError(f"containerd not ready after {timeout}s ({last}); log:\n{log_tail(layout)}")


def _status_messages() -> tuple[type[Message], type[Message]]:
    """CRI StatusRequest{verbose=2} / StatusResponse{info=2 map}: not in reaper's CRI subset.

    Built from a descriptor in a private pool (field numbers of k8s.io/cri-api runtime.v1).
    """
    fdp = descriptor_pb2.FileDescriptorProto(
        name="reaperlab/cri_status.proto", package="reaperlab.cri", syntax="proto3"
    )
    f = descriptor_pb2.FieldDescriptorProto
    req = fdp.message_type.add(name="StatusRequest")
    req.field.add(name="verbose", number=1, type=f.TYPE_BOOL, label=f.LABEL_OPTIONAL)
    resp = fdp.message_type.add(name="StatusResponse")
    entry = resp.nested_type.add(name="InfoEntry")
    entry.options.map_entry = True
    entry.field.add(name="key", number=1, type=f.TYPE_STRING, label=f.LABEL_OPTIONAL)
    entry.field.add(name="value", number=2, type=f.TYPE_STRING, label=f.LABEL_OPTIONAL)
    resp.field.add(
        name="info",
        number=2,
        type=f.TYPE_MESSAGE,
        label=f.LABEL_REPEATED,
        type_name=".reaperlab.cri.StatusResponse.InfoEntry",
    )
    pool = descriptor_pool.DescriptorPool()
    pool.Add(fdp)
    return (
        message_factory.GetMessageClass(pool.FindMessageTypeByName("reaperlab.cri.StatusRequest")),
        message_factory.GetMessageClass(pool.FindMessageTypeByName("reaperlab.cri.StatusResponse")),
    )


def runtime_status_info(endpoint: str, timeout: float) -> dict[str, str]:
    """CRI Status(verbose=true).info: containerd 1.6 puts ``cniconfig`` and
    ``lastCNILoadStatus`` there, which tells when a conf dir change has been loaded."""
    request_type, response_type = _status_messages()
    request = request_type(verbose=True)
    with grpc.insecure_channel(endpoint) as channel:
        stub = channel.unary_unary(
            "/runtime.v1.RuntimeService/Status",
            request_serializer=lambda m: m.SerializeToString(),
            response_deserializer=response_type.FromString,
        )
        try:
            response: Any = stub(request, timeout=timeout)
        except grpc.RpcError as err:
            raise CriError(f"Status on {endpoint}: {err}") from None
    return {str(k): str(v) for k, v in response.info.items()}


def loaded_cni_lists(info: dict[str, str]) -> list[str]:
    """The raw bytes (as text) of every network list containerd's CNI plugin has loaded."""
    try:
        config = json.loads(info.get("cniconfig", "{}"))
    except ValueError:
        return []
    sources: list[str] = []
    for network in config.get("Networks") or []:
        source = (network.get("Config") or {}).get("Source")
        if isinstance(source, str):
            sources.append(source)
    return sources
