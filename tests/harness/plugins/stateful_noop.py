#!/usr/bin/env python3
"""reaper-stateful-noop: a chained plugin with a datastore of its own (cni-reaper test lab).

ADD records the container in `noop-store` beside itself and passes prevResult on; DEL removes
the record, and fails while `fail-del` exists beside it. Nothing in it is in the reaper's list
of stateless plugins, so a chain with it keeps state only its DEL frees."""

from __future__ import annotations

import json
import os
import sys


def main() -> None:
    here = os.path.dirname(os.path.abspath(__file__))
    command = os.environ.get("CNI_COMMAND")
    if command == "VERSION":
        print(json.dumps({"cniVersion": "1.0.0", "supportedVersions": ["0.4.0", "1.0.0", "1.1.0"]}))
        sys.exit(0)
    conf = json.load(sys.stdin)
    store = os.path.join(here, "noop-store")
    os.makedirs(store, exist_ok=True)
    record = os.path.join(store, os.environ.get("CNI_CONTAINERID", "none"))
    if command == "ADD":
        open(record, "w").close()
        print(json.dumps(conf.get("prevResult") or {"cniVersion": conf.get("cniVersion")}))
    elif command == "DEL":
        if os.path.exists(os.path.join(here, "fail-del")):
            print(json.dumps({"cniVersion": conf.get("cniVersion"), "code": 11, "msg": "datastore unavailable"}))
            sys.exit(1)
        if os.path.exists(record):
            os.unlink(record)


if __name__ == "__main__":
    main()
