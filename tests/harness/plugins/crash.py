#!/usr/bin/env python3
"""A plugin that answers VERSION, then dies of SIGSEGV on every other command."""

from __future__ import annotations

import json
import os
import signal
import sys


def main() -> None:
    if os.environ.get("CNI_COMMAND") == "VERSION":
        print(json.dumps({"cniVersion": "1.0.0", "supportedVersions": ["0.4.0", "1.0.0"]}))
        sys.exit(0)
    os.kill(os.getpid(), signal.SIGSEGV)


if __name__ == "__main__":
    main()
