"""Network configs: the conf dir's `.conf`, `.conflist` and `.json` files, and cached configs.

Not a resource (nothing here is reclaimed), but the one reader of the format: the look, the
DEL and GC requests and the range gauges all take a config apart with `plugin_list`.
"""

from __future__ import annotations

import ipaddress
import os
from collections.abc import Iterable, Mapping
from typing import Any

from msgspec.structs import replace

from reaper.cni.result import fields
from reaper.host.confined import UnfitFile, open_root, read_admins, read_fd
from reaper.host.files import describe_oserror
from reaper.host.jsondoc import NotAnObject, parse_object
from reaper.model import CorruptFile, HostLocalRange, NetworkConfig
from reaper.names import is_cni_id, is_path

CONFIG_EXTENSIONS = (".conf", ".conflist", ".json")
CORRUPT_KIND = "netconf"  # what a report and the metrics call an unreadable network config
# host-local subnets that Calico's and Canal's plugins fill in from the node's podCIDRs, matched
# without regard to case as Calico's plugin does (strings.EqualFold), by the IP version they take
POD_CIDR_PLACEHOLDERS = {"usepodcidr": 4, "usepodcidripv6": 6}
FLANNEL_SUBNET_FILE = "/run/flannel/subnet.env"
MAX_CONFIG_BYTES = 1 << 20


class ConfigError(ValueError):
    pass


def _ranges(ipam: dict[str, Any]) -> tuple[list[HostLocalRange], list[int]]:
    """The ranges an IPAM section declares, and the IP versions of those the node's pod CIDR
    fills in."""
    if isinstance(ipam.get("ranges"), list):
        specs = [
            r for rangeset in ipam["ranges"] if isinstance(rangeset, list) for r in rangeset if isinstance(r, dict)
        ]
    else:
        specs = [ipam] if isinstance(ipam.get("subnet"), str) else []
    out = []
    pod_cidr_versions = []
    for spec in specs:
        subnet = spec.get("subnet")
        if not isinstance(subnet, str):
            raise ConfigError("host-local range without a subnet")
        version = POD_CIDR_PLACEHOLDERS.get(subnet.lower())
        if version is not None:
            pod_cidr_versions.append(version)
        else:
            out.append(host_local_range(subnet, spec))
    return out, pod_cidr_versions


def host_local_range(subnet: str, spec: Mapping[str, Any]) -> HostLocalRange:
    """One range with host-local's defaults: from .1 (the gateway, skipped) to the last address."""
    try:
        net = ipaddress.ip_network(subnet, strict=False)
        start = ipaddress.ip_address(spec["rangeStart"]) if spec.get("rangeStart") else net.network_address + 1
        if spec.get("rangeEnd"):
            end = ipaddress.ip_address(spec["rangeEnd"])
        else:
            end = net.broadcast_address - 1 if net.version == 4 else net.broadcast_address
        gateway = ipaddress.ip_address(spec["gateway"]) if spec.get("gateway") else net.network_address + 1
    except (ValueError, TypeError) as err:
        raise ConfigError(f"bad host-local range: {err}") from None
    return HostLocalRange(str(net), str(start), str(end), str(gateway))


def flannel_ranges(subnet_env: bytes) -> list[HostLocalRange]:
    """The host-local ranges flannel's plugin gives its delegate: the network of FLANNEL_SUBNET
    (and FLANNEL_IPV6_SUBNET), which subnet.env holds as its first address with the mask."""
    ranges = []
    for line in subnet_env.decode("utf-8", "replace").splitlines():
        key, sep, value = line.partition("=")
        if sep and key.strip() in ("FLANNEL_SUBNET", "FLANNEL_IPV6_SUBNET") and value.strip():
            try:
                ranges.append(host_local_range(value.strip(), {}))
            except ConfigError:
                continue
    return ranges


def _with_flannel_ranges(config: NetworkConfig) -> NetworkConfig:
    """A config with a `flannel` plugin: its ranges are in the subnet file flannel writes."""
    try:
        _, _, plugins = plugin_list(config.raw)
    except ConfigError:
        return config
    for plugin in plugins:
        if plugin.get("type") != "flannel":
            continue
        subnet_file = plugin.get("subnetFile")
        path = subnet_file if isinstance(subnet_file, str) and subnet_file.startswith("/") else FLANNEL_SUBNET_FILE
        try:
            data = read_admins(path, MAX_CONFIG_BYTES)
        except (OSError, UnfitFile):
            return config  # no flannel on this node yet, or not mounted: no range known
        return replace(config, ipam_ranges=config.ipam_ranges + tuple(flannel_ranges(data)))
    return config


def plugin_list(raw: bytes) -> tuple[str, str, list[dict[str, Any]]]:
    """(name, cniVersion, plugins) of a network list, or of a single-plugin config as libcni
    turns it into a list of one; ConfigError when it is neither."""
    return _read(raw)[1:]


def _read(raw: bytes) -> tuple[dict[str, Any], str, str, list[dict[str, Any]]]:
    try:
        doc = parse_object(raw)
    except NotAnObject as err:
        raise ConfigError(str(err)) from None
    except ValueError as err:
        raise ConfigError(f"invalid JSON: {err}") from None
    name = doc.get("name")
    if not isinstance(name, str) or not is_cni_id(name):
        raise ConfigError(f"invalid or missing network name {str(name)[:80]!r}")
    if isinstance(doc.get("plugins"), list):
        plugins = doc["plugins"]
    elif isinstance(doc.get("type"), str):
        plugins = [doc]
    else:
        raise ConfigError("neither a plugin list nor a plugin config")
    for plugin in plugins:
        if not isinstance(plugin, dict) or not isinstance(plugin.get("type"), str):
            raise ConfigError("a plugin without a type")
    version = doc.get("cniVersion")
    return doc, name, version if isinstance(version, str) else "", plugins


# IPAM plugins whose whole state is on this node, in files this reaper frees itself (or none).
LOCAL_IPAM = frozenset({"host-local", "static"})


# Plugins whose DEL frees nothing the reaper cannot free itself: what they make lives in the
# pod's netns, on the host's links and firewall, or in files the reaper's kinds know (flannel's
# per-container file, tuning's backup, host-local's leases). Any other may keep state only its
# own DEL frees (docs/design.md, "Plugins with state of their own").
STATELESS_PLUGINS = frozenset(
    {
        "bridge", "ptp", "macvlan", "ipvlan", "host-device", "loopback", "portmap", "bandwidth",
        "tuning", "sbr", "vrf", "firewall", "flannel",
    }
)  # fmt: skip


# Stateful plugins whose own DEL frees what they keep by the container ID alone, with CNI_NETNS
# empty, as containerd and CRI-O run it once the netns is gone (read in their sources, 2026-12),
# and only on this node:
# - cilium-cni (cilium/cilium plugins/cilium-cni/cmd/cmd.go Del): asks the node's own agent to
#   delete the endpoints of CNI_CONTAINERID and runs its delegated IPAM's DEL before it opens the
#   netns, then answers success when that netns does not exist (kubernetes#133081); older
#   releases answer an error there, and the entry is then kept as after any failed DEL. Its
#   chaining modes were not read: the plugins it is chained with must be on this list too.
# Any other stateful plugin may answer a DEL with no netns with success having freed nothing
# (kindnet does): its chain waits, but for the next list.
FREES_WITHOUT_NETNS = frozenset({"cilium-cni"})

# Stateful plugins whose DEL with CNI_NETNS empty frees by container ID too, but in the cluster's
# datastore, so only for a container ID proven this node's (reaper.runtime.listed; an ID no
# runtime here was seen to list may be a live pod's on another node). Read in
# projectcalico/calico: cni-plugin/pkg/plugin/plugin.go cmdDel hands a Kubernetes pod's DEL to
# cni-plugin/pkg/k8s/k8s.go CmdDelK8s, which deletes the pod's workload endpoint (named after this
# node and the pod) only when the endpoint's container ID is CNI_CONTAINERID, skips the netns when
# CNI_NETNS is empty (cni-plugin/pkg/dataplane/linux/dataplane_linux.go CleanUpNamespace) and runs
# its IPAM's DEL; calico-ipam (cni-plugin/pkg/ipamplugin/ipam_plugin.go cmdDel) releases the
# handle `<network>.<CNI_CONTAINERID>`, then the Calico 2.x handle `<namespace>.<pod>` of the pod
# CNI_ARGS names (hence the pod must be the runtime's too).
FREES_WITHOUT_NETNS_IF_LISTED_HERE = frozenset({"calico", "calico-ipam"})


def stateful_plugins(raw: bytes) -> tuple[str, ...] | None:
    """The plugins of a config (IPAM plugins included) that keep state only their own DEL
    frees, in chain order; None when the config cannot be read (nothing is known stateless)."""
    try:
        _, _, plugins = plugin_list(raw)
    except ConfigError:
        return None
    found: list[str] = []
    for plugin in plugins:
        kinds = [str(plugin["type"])]
        # Every spelling of `ipam` and its `type` that the plugin's Go decoder takes. An IPAM
        # section without a type string names no IPAM plugin (flannel hands such a section to
        # its delegate, which gets host-local), so it adds no plugin to the chain.
        for ipam in fields(plugin, "ipam"):
            if isinstance(ipam, dict):
                kinds += [t for t in fields(ipam, "type") if isinstance(t, str)]
        for kind in kinds:
            if kind not in STATELESS_PLUGINS and kind not in LOCAL_IPAM and kind not in found:
                found.append(kind)
    return tuple(found)


def gc_disabled(value: object) -> bool:
    """A list's `disableGC` as libcni reads it (readBool in containernetworking/cni
    libcni/conf.go): a boolean, or the string true or false in any case. Any other value makes
    libcni refuse the whole list, so no runtime runs it: the reaper then keeps its hands off
    too. libcni drops the key from a single-plugin config (ConfListFromConf); the reaper takes
    it there as well, since it only ever keeps."""
    if isinstance(value, bool):
        return value
    return not (isinstance(value, str) and value.lower() == "false")


def parse_network_config(raw: bytes, path: str) -> NetworkConfig:
    """A network config list (or a single-plugin config, as libcni turns it into a list)."""
    doc, name, version, plugins = _read(raw)
    types: list[str] = []
    data_dirs: list[str] = []
    ranges: list[HostLocalRange] = []
    pod_cidr_versions: list[int] = []
    for plugin in plugins:
        types.append(plugin["type"])
        ipam = plugin.get("ipam")
        if isinstance(ipam, dict) and ipam.get("type") == "host-local":
            data_dir = ipam.get("dataDir")
            if isinstance(data_dir, str) and data_dir.startswith("/") and is_path(data_dir):
                data_dirs.append(os.path.normpath(data_dir))
            declared, from_pod_cidr = _ranges(ipam)
            ranges.extend(declared)
            pod_cidr_versions.extend(v for v in from_pod_cidr if v not in pod_cidr_versions)
    return NetworkConfig(
        name=name,
        path=path,
        cni_version=version,
        plugin_types=tuple(types),
        ipam_data_dirs=tuple(data_dirs),
        ipam_ranges=tuple(ranges),
        disable_gc=gc_disabled(doc.get("disableGC", False)),
        raw=raw,
        pod_cidr_versions=tuple(pod_cidr_versions),
    )


def collect_configs_of(conf_dirs: Iterable[str]) -> tuple[list[NetworkConfig], list[CorruptFile]]:
    """The configs of every conf dir, in order. A network named in an earlier dir is left out
    of later ones: the dirs come serving runtime first, and that runtime runs its own copy,
    as libcni, looking a name up in one dir, takes the first file that has it."""
    configs: list[NetworkConfig] = []
    corrupt: list[CorruptFile] = []
    for conf_dir in dict.fromkeys(conf_dirs):
        named = {c.name for c in configs}
        found, bad = collect_configs(conf_dir)
        configs.extend(c for c in found if c.name not in named)
        corrupt.extend(bad)
    return configs, corrupt


def collect_configs(conf_dir: str) -> tuple[list[NetworkConfig], list[CorruptFile]]:
    """Every config in `conf_dir`, in libcni's order (sorted by file name)."""
    configs: list[NetworkConfig] = []
    corrupt: list[CorruptFile] = []
    try:
        root_fd = open_root(conf_dir)
    except FileNotFoundError:
        return configs, corrupt
    except OSError as err:
        return configs, [CorruptFile(CORRUPT_KIND, conf_dir, describe_oserror(err))]
    try:
        for name in sorted(os.listdir(root_fd)):
            if not name.endswith(CONFIG_EXTENSIONS):
                continue
            path = os.path.join(conf_dir, name)
            try:
                # The conf dir is the admin's and is never cleaned, and libcni follows links there
                # (the runtime loads what they point at): so does the reaper, to read only.
                fd = os.open(name, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=root_fd)
                try:
                    raw, _ = read_fd(fd, MAX_CONFIG_BYTES)
                finally:
                    os.close(fd)
                configs.append(_with_flannel_ranges(parse_network_config(raw, path)))
            except (OSError, UnfitFile, ConfigError) as err:
                msg = describe_oserror(err) if isinstance(err, OSError) else str(err)
                corrupt.append(CorruptFile(CORRUPT_KIND, path, msg))
    except OSError as err:
        corrupt.append(CorruptFile(CORRUPT_KIND, conf_dir, describe_oserror(err)))
    finally:
        os.close(root_fd)
    return configs, corrupt
