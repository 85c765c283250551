"""A real containerd + CNI test lab for cni-reaper (no mocks).

Example: ``with Lab() as lab: sandbox_id = lab.run_pod("web", port_mappings=[PortMap(8080, 80)])``,
then ``leak = lab.make_leak(with_cache=False)`` for resources no sandbox owns.
"""

from tests.harness.lab.cni import (
    CNI_VERSION,
    FAIL_PLUGIN,
    Leak,
    NetworkMode,
    NetworkSpec,
    PluginCall,
    PluginError,
    PortMap,
    add_network_list,
    del_network_list,
    masq_chain,
)
from tests.harness.lab.image import DEFAULT_CACHE_DIR, PAUSE_IMAGE, ImageBuildError, build_pause_image
from tests.harness.lab.kernel import is_nsfs, mounts_under, ns_id
from tests.harness.lab.lab import Lab, LabError, LabTeardownError, PodAttempt
from tests.harness.lab.runtime import RuntimeStartError

__all__ = [
    "CNI_VERSION",
    "DEFAULT_CACHE_DIR",
    "FAIL_PLUGIN",
    "PAUSE_IMAGE",
    "ImageBuildError",
    "Lab",
    "LabError",
    "LabTeardownError",
    "Leak",
    "NetworkMode",
    "NetworkSpec",
    "PluginCall",
    "PluginError",
    "PodAttempt",
    "PortMap",
    "RuntimeStartError",
    "add_network_list",
    "build_pause_image",
    "del_network_list",
    "is_nsfs",
    "masq_chain",
    "mounts_under",
    "ns_id",
]
