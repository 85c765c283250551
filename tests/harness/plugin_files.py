"""Per-container files of flannel and multus, byte for byte as those plugins write them.

Each builder follows the upstream code path step by step (named in its docstring, with the
release read); nothing here is upstream code. Go's encoding/json is reproduced for what these
files hold: compact output, map keys sorted (a Python dict stands for a Go struct when its keys
are left in field order), `<`, `>`, `&`, U+2028 and U+2029 escaped, other non-ASCII text as
UTF-8. Not reproduced, so kept out of the fixtures: floats, control characters, invalid UTF-8.
"""

from __future__ import annotations

import base64
import ipaddress
import json
from typing import Any

_GO_ESCAPES = (("<", "\\u003c"), (">", "\\u003e"), ("&", "\\u0026"), ("\u2028", "\\u2028"), ("\u2029", "\\u2029"))


def go_marshal(value: Any) -> bytes:
    """json.Marshal's bytes for `value`, each dict's keys in the order they are in."""
    text = json.dumps(value, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    for char, escaped in _GO_ESCAPES:
        text = text.replace(char, escaped)
    return text.encode()


def go_map(value: Any) -> Any:
    """`value` with every dict's keys sorted, as Go marshals a map[string]interface{}."""
    if isinstance(value, dict):
        return {k: go_map(value[k]) for k in sorted(value)}
    if isinstance(value, list):
        return [go_map(v) for v in value]
    return value


# ---------------------------------------------------------------------------------- flannel


def flannel_scratch(
    plugin_conf: dict[str, Any],
    *,
    network: str = "10.42.0.0/16",
    subnet: str = "10.42.0.1/24",
    mtu: int = 1450,
    ipmasq: bool = True,
    ipv6_network: str | None = None,
    ipv6_subnet: str | None = None,
) -> bytes:
    """`<dataDir>/<container ID>` as flannel-io/cni-plugin v1.9.1-flannel1 writes it for the
    flannel plugin config `plugin_conf` (as libcni passes it: with name and cniVersion) and a
    subnet.env holding these values.

    flannel.go cmdAdd (runtimeConfig copied into the delegate), flannel_linux.go doCmdAdd (name,
    type, ipMasq, mtu, isGateway, cniVersion) and getDelegateIPAM (ipam: type, ranges from
    FLANNEL_SUBNET parsed by net.ParseCIDR, so its network, routes from FLANNEL_NETWORK), then
    flannel.go delegateAdd: json.Marshal of the map, saved by saveScratchNetConf.
    """
    delegate = dict(plugin_conf.get("delegate") or {})
    if plugin_conf.get("runtimeConfig") is not None:
        delegate["runtimeConfig"] = plugin_conf["runtimeConfig"]
    delegate["name"] = plugin_conf["name"]
    delegate.setdefault("type", "bridge")
    delegate.setdefault("ipMasq", not ipmasq)
    delegate.setdefault("mtu", mtu)
    if delegate["type"] == "bridge":
        delegate.setdefault("isGateway", True)
    if plugin_conf.get("cniVersion"):
        delegate["cniVersion"] = plugin_conf["cniVersion"]
    ipam = dict(plugin_conf.get("ipam") or {})
    ipam.setdefault("type", "host-local")
    ranges = [[{"subnet": str(ipaddress.ip_interface(sn).network)}] for sn in (subnet, ipv6_subnet) if sn]
    ipam["ranges"] = ranges
    assert "routes" not in ipam, "a config's own ipam.routes are re-encoded as types.Route: not reproduced"
    ipam["routes"] = [{"dst": nw} for nw in (network, ipv6_network) if nw]  # types.Route: {"dst": ...}
    delegate["ipam"] = ipam
    return go_marshal(go_map(delegate))


# The flannel plugin config of k3s' and the upstream kube-flannel.yml's conflist ("cbr0"), as
# libcni hands it to the plugin (the list's name and cniVersion injected).
FLANNEL_CONF: dict[str, Any] = {
    "cniVersion": "1.0.0",
    "name": "cbr0",
    "type": "flannel",
    "delegate": {"hairpinMode": True, "forceAddress": True, "isDefaultGateway": True},
}


# ----------------------------------------------------------------------------------- multus


def _plugin_conf(conf: dict[str, Any]) -> dict[str, Any]:
    """A delegate's config decoded into cni v1.3.0's types.PluginConf and encoded by its
    MarshalJSON (through a map: sorted keys; `dns` dropped when empty)."""
    out: dict[str, Any] = {}
    for key in ("cniVersion", "name", "type"):
        if conf.get(key):
            out[key] = conf[key]
    if conf.get("capabilities"):
        out["capabilities"] = conf["capabilities"]
    ipam_type = (conf.get("ipam") or {}).get("type")
    out["ipam"] = {"type": ipam_type} if ipam_type else {}  # omitempty does nothing to a struct
    return {key: go_map(out[key]) for key in sorted(out)}


def _plugin_conf_v0_8(conf: dict[str, Any]) -> dict[str, Any]:
    """The same into cni v0.8.1's types.NetConf, which has no MarshalJSON: struct order, and
    `dns` (tagged without omitempty) always there."""
    out: dict[str, Any] = {key: conf[key] for key in ("cniVersion", "name", "type") if conf.get(key)}
    if conf.get("capabilities"):
        out["capabilities"] = go_map(conf["capabilities"])
    ipam_type = (conf.get("ipam") or {}).get("type")
    out["ipam"] = {"type": ipam_type} if ipam_type else {}
    out["dns"] = {}
    return out


def multus_delegate(
    config: bytes, selection: tuple[str, str] | None = None, ifname: str | None = None, *, v3: bool = False
) -> dict[str, Any]:
    """One `*types.DelegateNetConf` as json.Marshal writes it, made by LoadDelegateNetConf
    (pkg/types/conf.go) from a delegate's config bytes: a network's config from the conf dir
    (`selection` None) or a net-attach-def's spec.config (`selection` = (namespace, name), the
    Name then being `<namespace>/<name>`), with no device ID and no cni-args.

    multus-cni v4.3.0 (cni v1.3.0) by default; `v3`: v3.9.3 (cni v0.8.1), which has no
    CNINetworkConfigList field and encodes Conf in struct order.
    """
    conf = json.loads(config)
    encode = _plugin_conf_v0_8 if v3 else _plugin_conf
    out: dict[str, Any] = {"Conf": encode(conf)}
    name = conf.get("name", "")
    if conf.get("type"):
        out["ConfList"] = {}  # every field omitempty, none set
    else:  # LoadDelegateNetConfList: the config is a list
        conf_list: dict[str, Any] = {key: conf[key] for key in ("cniVersion", "name") if conf.get(key)}
        conf_list["plugins"] = [encode(p) for p in conf["plugins"]]
        out["ConfList"] = conf_list
    if not v3:  # libcni.NetworkConfigList, untagged, zero: only LoadDelegateNetConfFromConfList sets it
        out["CNINetworkConfigList"] = {
            "Name": "",
            "CNIVersion": "",
            "DisableCheck": False,
            "DisableGC": False,
            "LoadOnlyInlinedPlugins": False,
            "Plugins": None,
            "Bytes": None,
        }
    out["Name"] = f"{selection[0]}/{selection[1]}" if selection else name
    if ifname:
        out["ifnameRequest"] = ifname
    out["IsFilterV4Gateway"] = False
    out["IsFilterV6Gateway"] = False
    out["Bytes"] = base64.b64encode(config).decode()
    return out


def multus_scratch(delegates: list[dict[str, Any]]) -> bytes:
    """`<cniDir>/<container ID>`: pkg/multus/multus.go saveDelegates, json.Marshal of the
    []*types.DelegateNetConf, written by saveScratchNetConf."""
    return go_marshal(delegates)


# The cluster network's conflist in the conf dir, and a net-attach-def's spec.config, as the
# multus quickstart has them (the configs are the user's bytes, kept as they are in Bytes).
CLUSTER_CONFLIST = (
    b'{"name":"cbr0","cniVersion":"1.0.0","plugins":[{"type":"flannel","delegate":{"hairpinMode":true,'
    b'"isDefaultGateway":true}},{"type":"portmap","capabilities":{"portMappings":true}}]}'
)
MACVLAN_CONFIG = (
    b'{ "cniVersion": "0.3.1", "name": "macvlan-conf", "type": "macvlan", "master": "eth0", "mode": "bridge",'
    b' "ipam": { "type": "host-local", "subnet": "192.168.1.0/24", "rangeStart": "192.168.1.200",'
    b' "rangeEnd": "192.168.1.216", "routes": [ { "dst": "0.0.0.0/0" } ], "gateway": "192.168.1.1" } }'
)


def multus_pod_scratch(*, v3: bool = False) -> bytes:
    """A pod on the cluster network (by its name in the conf dir, k8sclient.go getNetDelegate
    option 2) with one macvlan net-attach-def in its own namespace."""
    return multus_scratch(
        [
            multus_delegate(CLUSTER_CONFLIST, v3=v3),
            multus_delegate(MACVLAN_CONFIG, ("default", "macvlan-conf"), v3=v3),
        ]
    )
