"""The `reaper` command (and `python -m reaper`).

For `scan`, the child that asks the runtimes is forked before anything else is imported: it
imports the CRI client (grpc: 0.1 s) while this process imports the rest, and the
pass waited on that import at 250 pods (reaper.runtime.forked). Every other command starts
as it is.
"""

from __future__ import annotations

import gc
import sys


def main() -> None:
    early = None
    if sys.argv[1:2] == ["scan"]:
        # A one-shot runs without the cycle collector (reaper.cli._one_shot): off before the
        # fork, no collection walks the objects both processes share, copying every page.
        gc.disable()
        from reaper.runtime.forked import ForkedLiveness  # noqa: PLC0415

        early = ForkedLiveness()
    from reaper.cli import entry  # noqa: PLC0415

    entry(early)


if __name__ == "__main__":
    main()
