"""Scan passes against a fake CRI runtime listing one sandbox, while a `sandbox_netns` entry for
it is planted in the state file before each pass: by one-shots and by an agent's KeptState.
Usage: planted_netns WORKDIR; run in a scratch netns. Prints the netns each pass used and the
runtime's PodSandboxStatus calls so far, as JSON."""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path

from reaper.runtime.cri import CriLiveness
from reaper.scan import scan_pass
from reaper.state import KeptState
from tests.harness.fake_cri import FakeRuntime, sandbox, sandbox_list
from tests.harness.scratch import scratch_settings

CREATED = 1_700_000_000_000_000_000


def main(work: Path) -> None:
    state = work / "state.json"
    settings = scratch_settings(work, endpoints=(f"unix://{work}/cri.sock",), runtime_timeout=5.0)
    log = logging.getLogger("probe")

    def plant() -> None:
        # Whoever writes the state dir says where the live sandbox's netns is.
        doc = json.loads(state.read_bytes()) if state.exists() else {"version": 2}
        doc["sandbox_netns"] = {f"web@{CREATED}": "/run/netns/planted"}
        state.write_text(json.dumps(doc))

    def netns_seen(kept: KeptState | None = None) -> str | None:
        liveness = CriLiveness(settings.runtime_endpoints, 5.0)
        (web,) = scan_pass(settings, liveness, log, kept=kept).report.runtime.sandboxes
        return web.netns_path

    out: dict[str, object] = {}
    listed = sandbox_list([sandbox("web", created_at=CREATED)])
    with FakeRuntime(work / "cri.sock", listed, {"web": "/run/netns/cni-web"}) as cri:
        plant()
        out["one_shot"] = [netns_seen(), cri.calls["PodSandboxStatus"]]
        plant()
        out["one_shot_again"] = [netns_seen(), cri.calls["PodSandboxStatus"]]
        kept = KeptState()
        plant()
        out["agent_first"] = [netns_seen(kept), cri.calls["PodSandboxStatus"]]
        plant()
        out["agent_second"] = [netns_seen(kept), cri.calls["PodSandboxStatus"]]
        out["saved_keys"] = sorted(json.loads(state.read_bytes()))
    print(json.dumps(out))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
