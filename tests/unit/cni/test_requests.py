"""The DEL request a runtime should have sent: stdin per plugin, args, prevResult conversion."""

from __future__ import annotations

import json
from pathlib import Path

from msgspec.structs import replace

from reaper.cni.requests import DelRequest, convert_result, plugin_stdin, request_from_cache
from reaper.kinds.cache import collect_cache, current_document
from reaper.kinds.netconf import plugin_list
from tests.harness.configs import cache_doc

CID = "a" * 64
LIST = {
    "cniVersion": "1.0.0",
    "name": "net1",
    "plugins": [
        {"type": "bridge", "ipam": {"type": "host-local"}},
        {"type": "portmap", "capabilities": {"portMappings": True, "bandwidth": False}},
    ],
}
RESULT = {"cniVersion": "0.4.0", "ips": [{"version": "4", "address": "10.0.0.5/24"}, {"address": "fd00::5/64"}]}


def test_each_plugin_gets_name_version_prev_result_and_only_its_capabilities() -> None:
    name, version, plugins = plugin_list(json.dumps(LIST).encode())
    request = DelRequest(
        container_id=CID, network="net1", ifname="eth0", netns="", config=b"", source="x",
        capability_args={"portMappings": [{"hostPort": 80}], "bandwidth": {"x": 1}}, prev_result=RESULT,
    )  # fmt: skip
    bridge, portmap = (plugin_stdin(p, name, version, request) for p in plugins)
    assert bridge["name"] == "net1" and bridge["cniVersion"] == "1.0.0" and "runtimeConfig" not in bridge
    assert portmap["runtimeConfig"] == {"portMappings": [{"hostPort": 80}]}
    prev = portmap["prevResult"]
    assert prev["cniVersion"] == "1.0.0" and all("version" not in ip for ip in prev["ips"])


def test_prev_result_goes_down_to_0_4_and_not_below() -> None:
    down = convert_result({"cniVersion": "1.0.0", "ips": [{"address": "fd00::5/64"}]}, "0.4.0")
    assert down["ips"][0]["version"] == "6"
    request = DelRequest(
        container_id=CID, network="net1", ifname="eth0", netns="", config=b"", source="x", prev_result=RESULT
    )
    old = plugin_stdin({"type": "bridge"}, "net1", "0.3.1", request)
    assert "prevResult" not in old  # the spec passes prevResult to DEL from 0.4.0 on


def test_single_plugin_config_is_a_list_of_one() -> None:
    name, version, plugins = plugin_list(json.dumps({"cniVersion": "0.4.0", "name": "n", "type": "ptp"}).encode())
    assert (name, version, [p["type"] for p in plugins]) == ("n", "0.4.0", ["ptp"])


def test_cache_entry_becomes_the_request_with_ignore_unknown(tmp_path: Path) -> None:
    entry = cache_doc(
        CID, "net1", config=LIST, cniArgs=[["K8S_POD_NAME", "web"]],
        capabilityArgs={"portMappings": []}, result=RESULT,
    )  # fmt: skip
    (tmp_path / "results").mkdir()
    path = tmp_path / "results" / f"net1-{CID}-eth0"
    path.write_text(json.dumps(entry))
    (found,) = collect_cache(str(tmp_path), set()).entries
    document = current_document(found)
    assert document is not None
    request = request_from_cache(document.doc, CID, "net1", "eth0", "/run/netns/x", str(path))
    assert request is not None and request.source == str(path)
    # Without IgnoreUnknown the plugins refuse K8S_* args and every DEL fails
    # (tests/unit/cni/test_cni_args.py: what an entry cannot change of it).
    assert request.cni_args == (("IgnoreUnknown", "1"), ("K8S_POD_NAME", "web"))
    assert request.netns == "/run/netns/x" and request.prev_result == RESULT
    # An entry that names another attachment now is not used.
    assert current_document(replace(found, container_id="b" * 64)) is None
