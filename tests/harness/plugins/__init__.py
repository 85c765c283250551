"""CNI plugins of the tests' own, each a script the lab installs in its bin dir
(`lab.install_plugin(name, script(module))`) and the runtime or the reaper runs by its shebang
with the host's python3: each is copied alone, so it imports the standard library alone."""

from __future__ import annotations

from pathlib import Path
from types import ModuleType


def script(plugin: ModuleType) -> str:
    """The plugin's file, as the bin dir gets it."""
    assert plugin.__file__ is not None
    return Path(plugin.__file__).read_text()
