#!/usr/bin/env python3
"""A plugin that prints bytes that are no JSON on every command; exits 0 on DEL, 1 otherwise."""

from __future__ import annotations

import os
import sys


def main() -> None:
    sys.stdout.buffer.write(b"\x00\xffnot json at all {{{" * 100)
    sys.exit(0 if os.environ.get("CNI_COMMAND") == "DEL" else 1)


if __name__ == "__main__":
    main()
