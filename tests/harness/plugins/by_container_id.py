#!/usr/bin/env python3
"""A stand-in for a plugin whose DEL frees by container ID without a netns (cni-reaper test lab),
installed as `calico` or `cilium-cni`: it keeps its attachments in `<its name>-store/<container
ID>` beside itself, and each call is a line of `<its name>-calls.jsonl` beside it.

Written to the DEL paths of the real plugins: Calico (projectcalico/calico
cni-plugin/pkg/k8s/k8s.go CmdDelK8s) deletes its workload endpoint only when the endpoint's
container ID is CNI_CONTAINERID, skips the netns when CNI_NETNS is empty
(cni-plugin/pkg/dataplane/linux/dataplane_linux.go CleanUpNamespace) and releases its addresses
by a handle made of the container ID (cni-plugin/pkg/ipamplugin/ipam_plugin.go cmdDel); Cilium
(cilium/cilium plugins/cilium-cni/cmd/cmd.go Del) deletes its endpoints by container ID and
releases its IPAM before it opens the netns, then answers success when that netns does not
exist. So DEL here removes the record of CNI_CONTAINERID and succeeds, with or without a netns;
while `<its name>-store/fail-del` exists it fails (code 11) and frees nothing."""

from __future__ import annotations

import json
import os
import sys
from typing import Any, NoReturn


def fail(conf: dict[str, Any], code: int, msg: str) -> NoReturn:
    print(json.dumps({"cniVersion": conf.get("cniVersion"), "code": code, "msg": msg}))
    sys.exit(1)


def main() -> None:
    here, name = os.path.split(os.path.abspath(__file__))
    store = os.path.join(here, f"{name}-store")
    command = os.environ.get("CNI_COMMAND")
    if command == "VERSION":
        print(json.dumps({"cniVersion": "1.1.0", "supportedVersions": ["0.4.0", "1.0.0", "1.1.0"]}))
        sys.exit(0)
    conf: dict[str, Any] = json.load(sys.stdin)
    call = {
        "command": command,
        "netns": os.environ.get("CNI_NETNS"),
        "id": os.environ.get("CNI_CONTAINERID"),
        "prev": conf.get("prevResult"),
    }
    with open(os.path.join(here, f"{name}-calls.jsonl"), "a") as log:
        log.write(json.dumps(call) + "\n")
    if command == "STATUS":
        sys.exit(0)
    os.makedirs(store, exist_ok=True)
    record = os.path.join(store, os.environ["CNI_CONTAINERID"])
    if command == "ADD":
        with open(record, "w") as f:
            f.write(os.environ["CNI_NETNS"])
        interfaces = [{"name": os.environ["CNI_IFNAME"], "sandbox": os.environ["CNI_NETNS"]}]
        print(json.dumps({"cniVersion": conf["cniVersion"], "interfaces": interfaces}))
    elif command == "DEL":
        if os.path.exists(os.path.join(store, "fail-del")):
            fail(conf, 11, "datastore unavailable, try later")
        if os.path.exists(record):
            os.unlink(record)


if __name__ == "__main__":
    main()
