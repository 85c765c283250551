"""The two parts the settings hand on whole: what the look reads (`FindOptions`, as
`Settings.find`) and what the reclaim plan weighs (`ReapPolicy`, as `ReapSettings.policy`).
Apart from both sides so that neither imports the other (reaper.reap imports reaper.settings).
"""

from __future__ import annotations

import re

from msgspec import Struct

from reaper.podcidr import PodCidrs

COMMAND_TIMEOUT = 30.0  # seconds for one run of iptables-save, iptables-restore or nft


class FindOptions(Struct, frozen=True, kw_only=True):
    """Where the look finds each kind's records, and which pin names are a runtime's."""

    netns_dirs: tuple[str, ...]
    ipam_dirs: tuple[str, ...]
    cache_dir: str
    conf_dir: str
    bin_dirs: tuple[str, ...]
    netns_patterns: tuple[re.Pattern[str], ...]
    command_timeout: float = COMMAND_TIMEOUT
    # The other present runtimes' conf dirs (Layout.conf_dirs), when the conf dir was detected;
    # never beside a --cni-conf-dir or REAPER_CNI_CONF_DIR, which names the only one.
    more_conf_dirs: tuple[str, ...] = ()
    # For ranges whose subnet is usePodCidr (range gauges only); set by settings.with_pod_cidrs
    pod_cidrs: PodCidrs | None = None
    # CRI-O's namespaces_dir, where it pins a sandbox's other namespaces beside its netns pin
    namespaces_dirs: tuple[str, ...] = ()

    @property
    def conf_dirs(self) -> tuple[str, ...]:
        """Every conf dir whose configs are the node's own; the first wins a shared name."""
        return tuple(dict.fromkeys((self.conf_dir, *self.more_conf_dirs)))


class ReapPolicy(Struct, frozen=True, kw_only=True):
    """The parts of the reap settings the plan depends on."""

    max_reap: int
    max_orphan_ratio: float
    kernel_only: bool
    # --quarantine-dir: the plan moves files a kind can keep there; acting makes the Quarantine
    quarantine_dir: str | None
    force: bool

    @property
    def quarantine(self) -> bool:
        """Reclaimed lease and cache files are moved to the quarantine dir, not deleted."""
        return self.quarantine_dir is not None
