#!/usr/bin/env python3
"""reaper-datastore: a CNI plugin that keeps its attachments in a datastore of its own (cni-reaper
test lab): `datastore/<container ID>` beside itself, holding the netns. Each call is a line of
`datastore-calls.jsonl` beside it. STATUS fails while `datastore/not-ready` exists, DEL while
`datastore/fail-del` does; a DEL with no netns does nothing and succeeds, as kindnet's."""

from __future__ import annotations

import json
import os
import sys
from typing import Any, NoReturn


def fail(conf: dict[str, Any], code: int, msg: str) -> NoReturn:
    print(json.dumps({"cniVersion": conf.get("cniVersion"), "code": code, "msg": msg}))
    sys.exit(1)


def main() -> None:
    here = os.path.dirname(os.path.abspath(__file__))
    store = os.path.join(here, "datastore")
    command = os.environ.get("CNI_COMMAND")
    if command == "VERSION":
        print(json.dumps({"cniVersion": "1.1.0", "supportedVersions": ["1.0.0", "1.1.0"]}))
        sys.exit(0)
    conf: dict[str, Any] = json.load(sys.stdin)
    call = {"command": command, "netns": os.environ.get("CNI_NETNS"), "id": os.environ.get("CNI_CONTAINERID")}
    with open(os.path.join(here, "datastore-calls.jsonl"), "a") as log:
        log.write(json.dumps(call) + "\n")
    if command == "STATUS":
        if os.path.exists(os.path.join(store, "not-ready")):
            fail(conf, 50, "datastore not ready")
        sys.exit(0)
    record = os.path.join(store, os.environ["CNI_CONTAINERID"])
    if command == "ADD":
        with open(record, "w") as f:
            f.write(os.environ["CNI_NETNS"])
        ifname = os.environ["CNI_IFNAME"]
        interfaces = [{"name": ifname, "sandbox": os.environ["CNI_NETNS"]}]
        print(json.dumps({"cniVersion": conf["cniVersion"], "interfaces": interfaces}))
    elif command == "DEL":
        if not os.environ.get("CNI_NETNS"):
            sys.exit(0)  # as kindnet: no netns, nothing to do, success
        if os.path.exists(os.path.join(store, "fail-del")):
            fail(conf, 11, "datastore unavailable, try later")
        if os.path.exists(record):
            os.unlink(record)


if __name__ == "__main__":
    main()
