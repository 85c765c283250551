"""Validation of names read from disk or from a runtime, before they become paths or arguments."""

from __future__ import annotations

import os
import re
from collections.abc import Iterable

# CNI spec: container IDs and network names.
_CNI_ID = re.compile(r"[a-zA-Z0-9][a-zA-Z0-9_.\-]*")
PLUGIN_TYPE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.\-]{0,127}")  # a file name in a bin dir, never a path
_IFNAME = re.compile(r"[^/:\s\x00-\x1f\x7f]{1,15}")  # no slash, colon, space or control byte
# Runtime-made netns pin names: containerd `cni-<uuid>`, CRI-O a bare uuid (not Docker's: see
# is_runtime_netns_name).
_UUID = r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}"
RUNTIME_NETNS_PATTERNS: tuple[str, ...] = (rf"cni-{_UUID}", _UUID)

MAX_NAME = 1024


def is_cni_id(value: str) -> bool:
    """A container ID or network name as the CNI spec allows it."""
    return 0 < len(value) <= MAX_NAME and _CNI_ID.fullmatch(value) is not None


def is_ifname(value: str) -> bool:
    """An interface name as the CNI spec (and the kernel) allows it."""
    return value not in (".", "..") and _IFNAME.fullmatch(value) is not None


def compile_netns_patterns(extra: tuple[str, ...]) -> tuple[re.Pattern[str], ...]:
    """Patterns of pin names a runtime makes; raises re.error on a bad extra pattern."""
    return tuple(re.compile(p) for p in RUNTIME_NETNS_PATTERNS + extra)


def is_runtime_netns_name(name: str, patterns: Iterable[re.Pattern[str]]) -> bool:
    """A pin name a runtime makes: one of `patterns`. Not Docker's 12-hex names (plain `docker run`
    containers pin there too, listed by no CRI runtime): such a pin goes only with an attachment
    a cache entry or sandbox names (docs/design.md, "Docker's pins")."""
    return any(p.fullmatch(name) for p in patterns)


MAX_PATH = 4096  # PATH_MAX


def is_path(text: str) -> bool:
    """A string the kernel could take as a path: no NUL, nothing that does not encode, not longer than PATH_MAX."""
    try:
        os.fsencode(text)
    except UnicodeEncodeError:
        return False
    return "\0" not in text and len(text) < MAX_PATH
