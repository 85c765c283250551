"""Settings for a pass over a scratch node: empty netns, IPAM, cache, conf and bin dirs made
under one work dir, a state file beside them, JSON out and quiet logs."""

from __future__ import annotations

from pathlib import Path

from reaper.model import Policy
from reaper.names import compile_netns_patterns
from reaper.options import FindOptions
from reaper.settings import Settings

DIRS = ("netns", "ipam", "cache", "conf", "bin")


def scratch_settings(
    work: Path, *, endpoints: tuple[str, ...] = (), runtime_timeout: float = 1.0, confirmations: int = 1
) -> Settings:
    """The dirs made (if missing) and the settings that point a pass at them, min-age 0."""
    for sub in DIRS:
        (work / sub).mkdir(parents=True, exist_ok=True)
    return Settings(
        find=FindOptions(
            netns_dirs=(str(work / "netns"),),
            ipam_dirs=(str(work / "ipam"),),
            cache_dir=str(work / "cache"),
            conf_dir=str(work / "conf"),
            bin_dirs=(str(work / "bin"),),
            netns_patterns=compile_netns_patterns(()),
        ),
        runtime_endpoints=endpoints,
        runtime_timeout=runtime_timeout,
        policy=Policy(min_age=0.0, confirmations=confirmations, stuck_after=900.0),
        state_file=str(work / "state.json"),
        json_output=True,
        log_format="text",
        log_level="warning",
    )
