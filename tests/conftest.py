"""Markers by directory: unit/ (pure, anywhere), node/ (root, a real containerd lab),
packaging/ (chart, image, units, rules). Node tests skip cleanly when not run as root."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent
MARKERS = {
    "unit": "pure logic and parsers; no root, no lab",
    "node": "root and the real lab: containerd, runc, CNI plugins, namespaces, iptables",
    "packaging": "the Helm chart, the Dockerfile, the systemd units, the alert rules",
}


def pytest_configure(config: pytest.Config) -> None:
    for name, text in MARKERS.items():
        config.addinivalue_line("markers", f"{name}: {text}")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    not_root = pytest.mark.skip(reason="needs root: the lab runs a real containerd and makes namespaces")
    for item in items:
        parts = Path(str(item.fspath)).resolve().relative_to(TESTS).parts
        if parts and parts[0] in MARKERS:
            item.add_marker(parts[0])
        if parts and parts[0] == "node" and os.geteuid() != 0:
            item.add_marker(not_root)
