"""Churn on the real runtime: the agent reaps at min-age 0 while pods come and go."""

from __future__ import annotations

from pathlib import Path

from tests.harness.churn import run_churn
from tests.harness.lab import Lab
from tests.harness.podman import LabPodman


def test_churn_harms_no_live_pod_and_reclaims_every_leak(tmp_path: Path) -> None:
    with Lab() as lab:
        figures = run_churn(lab, seconds=40, seed=20261129, workdir=tmp_path)
    print("\n".join(figures.lines()))
    assert figures.live_harmed == 0, figures.harm[:10]
    assert figures.duplicate_ips == 0
    assert figures.creations_failed == 0, figures.harm[:10]
    assert figures.pods_created >= 10 and figures.leaks_injected >= 5 and figures.passes >= 10
    assert figures.leaks_reclaimed == figures.leaks_injected


def test_churn_beside_a_decoy_runtime_and_podman(tmp_path: Path) -> None:
    """The same churn with a second CRI runtime that lists no pods, asked first, and podman
    containers coming and going in the same dirs: nothing live is harmed."""
    with Lab() as lab, Lab() as decoy:
        podman = LabPodman(lab)
        try:
            figures = run_churn(lab, seconds=40, seed=20261130, workdir=tmp_path, decoy=decoy, podman=podman)
        finally:
            podman.close()
    print("\n".join(figures.lines()))
    assert figures.live_harmed == 0, figures.harm[:10]
    assert figures.duplicate_ips == 0
    assert figures.creations_failed == 0, figures.harm[:10]
    assert figures.pods_created >= 5 and figures.leaks_injected >= 3 and figures.passes >= 10
    assert figures.podman_started >= 2
    assert figures.leaks_reclaimed == figures.leaks_injected
