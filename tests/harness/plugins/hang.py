#!/usr/bin/env python3
"""A plugin that hangs on every command but VERSION, after starting a child of its own
(`sleep 600 reaper-hang-child`)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time


def main() -> None:
    if os.environ.get("CNI_COMMAND") == "VERSION":
        print(json.dumps({"cniVersion": "1.0.0", "supportedVersions": ["0.4.0", "1.0.0"]}))
        sys.exit(0)
    sys.stdin.read()
    subprocess.Popen(["sleep", "600", "reaper-hang-child"])
    time.sleep(600)


if __name__ == "__main__":
    main()
