"""The churn test's code for longer: `make bench-churn` (default 5 minutes; CHURN_SECONDS=N)."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from tests.harness.churn import run_churn
from tests.harness.lab import Lab


def main() -> None:
    seconds = float(os.environ.get("CHURN_SECONDS", "300"))
    with Lab() as lab, tempfile.TemporaryDirectory() as tmp:
        figures = run_churn(lab, seconds=seconds, seed=int(os.environ.get("CHURN_SEED", "1")), workdir=Path(tmp))
    print("\n".join(figures.lines()))
    for line in figures.harm[:20]:
        print("  harm:", line)


if __name__ == "__main__":
    main()
