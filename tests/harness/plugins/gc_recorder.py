#!/usr/bin/env python3
"""A CNI 1.1.0 plugin that records each command it gets, with its config, as a line of
`gc-calls.jsonl` beside itself; it does nothing else."""

from __future__ import annotations

import json
import os
import sys


def main() -> None:
    if os.environ.get("CNI_COMMAND") == "VERSION":
        print(json.dumps({"cniVersion": "1.1.0", "supportedVersions": ["1.0.0", "1.1.0"]}))
        sys.exit(0)
    conf = json.load(sys.stdin)
    with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "gc-calls.jsonl"), "a") as f:
        f.write(json.dumps({"command": os.environ.get("CNI_COMMAND"), "conf": conf}) + "\n")


if __name__ == "__main__":
    main()
