"""CNI side of the lab: network configs, the failing test plugin, and the plugin exec protocol.

The leak generator runs the REAL plugins (bridge, host-local, portmap from /usr/lib/cni) the
way libcni does, for container IDs the runtime never saw, and can write the libcni cache entry
libcni would have written after a successful ADD.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

CNI_VERSION = "1.0.0"
FAIL_PLUGIN = "reaper-fail"
IFNAME = "eth0"
PLUGIN_TIMEOUT = 60.0
_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

NetworkMode = Literal["normal", "empty", "failing"]
# Plugins a lab may chain after bridge and portmap, as nodes chain them: bandwidth shapes a pod
# whose annotations ask for it (the runtime passes them as the `bandwidth` capability), firewall
# accepts every pod's addresses in CNI-FORWARD.
ChainExtra = Literal["bandwidth", "firewall"]
CHAIN_EXTRAS: dict[ChainExtra, dict[str, object]] = {
    "bandwidth": {"type": "bandwidth", "capabilities": {"bandwidth": True}},
    "firewall": {"type": "firewall", "backend": "iptables"},
}

# A plugin that answers VERSION and fails every other command with a CNI error, as in the seed
# report "a chained conflist whose later plugin fails ADD". It fails DEL too, so the runtime's
# Stop/Remove keep failing, as seen with containerd 1.6.20.
FAIL_PLUGIN_SCRIPT = """#!/bin/sh
# reaper-fail: a CNI plugin that fails every command but VERSION (cni-reaper test lab).
if [ "$CNI_COMMAND" = "VERSION" ]; then
    printf '%s\\n' '{"cniVersion":"1.0.0","supportedVersions":["0.3.0","0.3.1","0.4.0","1.0.0"]}'
    exit 0
fi
cat >/dev/null
printf '{"cniVersion":"1.0.0","code":100,"msg":"reaper-fail: injected %s failure",\
"details":"container %s"}\\n' "$CNI_COMMAND" "$CNI_CONTAINERID"
exit 1
"""


@dataclass(frozen=True)
class PortMap:
    """One hostPort mapping, as CRI and the portmap plugin's capability arg know it."""

    host_port: int
    container_port: int
    protocol: Literal["tcp", "udp", "sctp"] = "tcp"
    host_ip: str = ""

    def capability_arg(self) -> dict[str, object]:
        """The ``portMappings`` entry as containerd 1.6 (go-cni) passes it to libcni.

        go-cni's PortMapping has no JSON tags, so the keys are capitalised (seen in containerd's
        cache entries); the portmap plugin reads them case-insensitively.
        """
        return {
            "HostPort": self.host_port,
            "ContainerPort": self.container_port,
            "Protocol": self.protocol,
            "HostIP": self.host_ip,
        }


# containerd 1.6 always passes this capability arg (null without pod annotations).
POD_ANNOTATIONS_CAPABILITY = "io.kubernetes.cri.pod-annotations"


def containerd_capability_args(port_mappings: Sequence[PortMap]) -> dict[str, object]:
    """The capabilityArgs containerd 1.6 gives libcni: portMappings only when there are some."""
    caps: dict[str, object] = {POD_ANNOTATIONS_CAPABILITY: None}
    if port_mappings:
        caps["portMappings"] = [p.capability_arg() for p in port_mappings]
    return caps


@dataclass(frozen=True)
class NetworkSpec:
    """What the lab's conflist is made of."""

    name: str
    bridge: str
    subnet: str
    ipam_dir: Path
    extras: tuple[ChainExtra, ...] = ()

    def plugins(self, mode: NetworkMode) -> list[dict[str, object]]:
        if mode == "empty":
            return []
        plugins: list[dict[str, object]] = [
            {
                "type": "bridge",
                "bridge": self.bridge,
                "isGateway": True,
                "ipMasq": True,
                "ipam": {
                    "type": "host-local",
                    "ranges": [[{"subnet": self.subnet}]],
                    "routes": [{"dst": "0.0.0.0/0"}],
                    "dataDir": str(self.ipam_dir),
                },
            },
            {"type": "portmap", "capabilities": {"portMappings": True}, "snat": True},
            *(dict(CHAIN_EXTRAS[extra]) for extra in self.extras),
        ]
        if mode == "failing":
            plugins.append({"type": FAIL_PLUGIN})
        return plugins

    def conflist_bytes(self, mode: NetworkMode) -> bytes:
        """The exact bytes written to the conf dir (and base64'd into cache entries)."""
        conflist = {"cniVersion": CNI_VERSION, "name": self.name, "plugins": self.plugins(mode)}
        return (json.dumps(conflist, indent=2) + "\n").encode()


class PluginError(Exception):
    """A plugin exited non-zero; ``code``/``msg`` come from its CNI error JSON when it gave one."""

    def __init__(self, plugin: str, command: str, code: int | None, msg: str) -> None:
        super().__init__(f"CNI plugin {plugin} {command} failed (code {code}): {msg}")
        self.plugin = plugin
        self.command = command
        self.code = code
        self.msg = msg


@dataclass(frozen=True)
class PluginCall:
    """Everything one plugin invocation needs besides the plugin's own config."""

    command: Literal["ADD", "DEL", "CHECK"]
    container_id: str
    netns: str
    ifname: str
    cni_args: tuple[tuple[str, str], ...]
    bin_dir: Path
    exec_netns: Path | None  # run the plugin in this netns (nsenter --net), or the caller's

    def env(self) -> dict[str, str]:
        return {
            "PATH": os.environ.get("PATH", _PATH),
            "CNI_COMMAND": self.command,
            "CNI_CONTAINERID": self.container_id,
            "CNI_NETNS": self.netns,
            "CNI_IFNAME": self.ifname,
            "CNI_ARGS": ";".join(f"{k}={v}" for k, v in self.cni_args),
            "CNI_PATH": str(self.bin_dir),
        }


def plugin_stdin(
    plugin: Mapping[str, object],
    name: str,
    cni_version: str,
    prev_result: Mapping[str, object] | None,
    capability_args: Mapping[str, object],
) -> dict[str, object]:
    """The stdin libcni gives one plugin of a list (cni-facts.md section 3)."""
    conf: dict[str, object] = dict(plugin)
    conf["name"] = name
    conf["cniVersion"] = cni_version
    if prev_result is not None:
        conf["prevResult"] = dict(prev_result)
    caps = plugin.get("capabilities")
    runtime_config = {
        key: value for key, value in capability_args.items() if isinstance(caps, dict) and caps.get(key) is True
    }
    if runtime_config:
        conf["runtimeConfig"] = runtime_config
    return conf


def exec_plugin(call: PluginCall, conf: Mapping[str, object]) -> dict[str, object]:
    """Run one plugin with the CNI exec protocol; return its parsed stdout (may be empty)."""
    plugin_type = str(conf["type"])
    binary = call.bin_dir / plugin_type
    argv = [str(binary)]
    if call.exec_netns is not None:
        argv = ["nsenter", f"--net={call.exec_netns}", *argv]
    proc = subprocess.run(
        argv,
        input=json.dumps(conf).encode(),
        env=call.env(),
        capture_output=True,
        timeout=PLUGIN_TIMEOUT,
        check=False,
    )
    out = proc.stdout.decode(errors="replace").strip()
    if proc.returncode != 0:
        code: int | None = None
        msg = out or proc.stderr.decode(errors="replace").strip()
        try:
            err = json.loads(out)
        except ValueError:
            err = None
        if isinstance(err, dict):
            raw_code = err.get("code")
            code = raw_code if isinstance(raw_code, int) else None
            msg = f"{err.get('msg', '')}; {err.get('details', '')}".strip("; ")
        raise PluginError(plugin_type, call.command, code, msg)
    if not out:
        return {}
    result = json.loads(out)
    if not isinstance(result, dict):
        raise PluginError(plugin_type, call.command, None, f"result is not an object: {out[:200]}")
    return result


def add_network_list(
    conflist: Mapping[str, object], call: PluginCall, capability_args: Mapping[str, object]
) -> dict[str, object]:
    """ADD every plugin of the list in order, chaining prevResult; return the final result."""
    name = str(conflist["name"])
    version = str(conflist["cniVersion"])
    plugins = conflist["plugins"]
    assert isinstance(plugins, list)
    result: dict[str, object] | None = None
    for plugin in plugins:
        assert isinstance(plugin, dict)
        stdin = plugin_stdin(plugin, name, version, result, capability_args)
        result = exec_plugin(call, stdin)
    return result or {}


def del_network_list(
    conflist: Mapping[str, object],
    call: PluginCall,
    capability_args: Mapping[str, object],
    prev_result: Mapping[str, object] | None,
) -> None:
    """DEL every plugin of the list in reverse order; stop at the first error, like libcni."""
    name = str(conflist["name"])
    version = str(conflist["cniVersion"])
    plugins = conflist["plugins"]
    assert isinstance(plugins, list)
    for plugin in reversed(plugins):
        assert isinstance(plugin, dict)
        exec_plugin(call, plugin_stdin(plugin, name, version, prev_result, capability_args))


def masq_chain(network: str, container_id: str) -> str:
    """The bridge plugin's ipMasq nat chain: CNI- + 24 hex of sha512(network + id)."""
    return "CNI-" + hashlib.sha512((network + container_id).encode()).hexdigest()[:24]


KNFTABLES_COMMENT_MAX = 128


def masq_comment(network: str, ifname: str, container_id: str) -> str:
    """The comment plugins >= 1.6 give a masquerade rule in their nftables backend, written as
    commentForInstance in containernetworking/plugins pkg/ip/ipmasq_nftables_linux.go writes
    it: a 16+16 hex instance hash, a description with quotes dropped, cut at knftables' 128."""

    def hashed(text: str) -> str:
        return hashlib.sha512(text.encode()).hexdigest()[:16]

    plain = [v.replace('"', "") for v in (network, ifname, container_id)]
    comment = (
        f"{hashed(network)}-{hashed(ifname + ':' + container_id)}, net: {plain[0]}, if: {plain[1]}, id: {plain[2]}"
    )
    return comment[:KNFTABLES_COMMENT_MAX]


def cache_entry(
    *,
    container_id: str,
    network: str,
    ifname: str,
    conflist: bytes,
    cni_args: Sequence[tuple[str, str]],
    capability_args: Mapping[str, object],
    result: Mapping[str, object],
) -> dict[str, object]:
    """A libcni (v1.1, as vendored by containerd 1.6) cache entry: kind cniCacheV1."""
    entry: dict[str, object] = {
        "kind": "cniCacheV1",
        "containerId": container_id,
        "config": base64.b64encode(conflist).decode(),
        "ifName": ifname,
        "networkName": network,
    }
    if cni_args:
        entry["cniArgs"] = [[k, v] for k, v in cni_args]
    if capability_args:
        entry["capabilityArgs"] = dict(capability_args)
    entry["result"] = dict(result)
    return entry


def write_cache_entry(cache_dir: Path, entry: Mapping[str, object]) -> Path:
    """Write ``<cache_dir>/results/<net>-<id>-<if>`` (dir 0700, file 0600) as libcni does."""
    results = cache_dir / "results"
    results.mkdir(mode=0o700, parents=True, exist_ok=True)
    path = results / f"{entry['networkName']}-{entry['containerId']}-{entry['ifName']}"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(json.dumps(entry).encode())
    return path


def add_and_cache(cache_dir: Path, conflist: Mapping[str, object], call: PluginCall) -> tuple[dict[str, object], Path]:
    """ADD the network list as a runtime does (add_network_list), then cache its result as
    libcni does (cache_entry, write_cache_entry): the result and the cache entry's path."""
    result = add_network_list(conflist, call, {})
    entry = cache_entry(
        container_id=call.container_id,
        network=str(conflist["name"]),
        ifname=call.ifname,
        conflist=json.dumps(conflist).encode(),
        cni_args=call.cni_args,
        capability_args={},
        result=result,
    )
    return result, write_cache_entry(cache_dir, entry)


def result_ip(result: Mapping[str, object]) -> str:
    """The first IP of a CNI (>= 0.3.0) result, without its prefix length."""
    ips = result.get("ips")
    if not isinstance(ips, list) or not ips or not isinstance(ips[0], dict):
        raise ValueError(f"CNI result has no ips: {result}")
    return str(ips[0]["address"]).split("/", 1)[0]


def result_host_veth(result: Mapping[str, object], bridge: str) -> str:
    """The bridge plugin's host-side veth: the interface with no sandbox that is not the bridge."""
    interfaces = result.get("interfaces")
    if isinstance(interfaces, list):
        for iface in interfaces:
            if isinstance(iface, dict) and not iface.get("sandbox") and iface.get("name") != bridge:
                return str(iface["name"])
    raise ValueError(f"CNI result has no host veth: {result}")


@dataclass(frozen=True)
class Leak:
    """Network resources made by running the plugins for a container the runtime never saw."""

    container_id: str
    network: str
    ifname: str
    netns_path: Path
    ip: str
    host_veth: str
    cache_path: Path | None
    lease_path: Path
    masq_chain: str
    port_mappings: tuple[PortMap, ...] = field(default=())
    result: Mapping[str, object] = field(default_factory=dict, compare=False, repr=False)
