"""`disableGC: true` on a real lab: a leak on that network is kept, even by `reap --force`.

The CNI spec's switch for a config list several runtimes share: runtimes must not GC it
(containernetworking/cni SPEC.md; libcni's GCNetworkList returns first thing when it is set,
libcni/api.go). The reaper's reclaim is a GC of the network's attachments, so it keeps out.
"""

from __future__ import annotations

import json
from pathlib import Path

from tests.harness.lab import Lab
from tests.harness.reap_helpers import REAP, leak_left
from tests.harness.reaper_cli import attachments_by_key, run_reaper


def test_a_leak_on_a_network_whose_config_says_disable_gc_is_not_reclaimed_by_force(lab: Lab, tmp_path: Path) -> None:
    leak = lab.make_leak(with_cache=True)
    everything = leak_left(lab, leak)
    assert everything == ["netns " + leak.netns_path.name, f"veth {leak.host_veth}", f"lease {leak.ip}",
                          "cache entry", "chains"]  # fmt: skip
    conf = lab.conf_dir / f"10-{lab.network_name}.conflist"
    original = conf.read_bytes()
    conf.write_text(json.dumps({**json.loads(original), "disableGC": True}))
    try:
        run = run_reaper(lab, "reap", tmp_path / "state.json", "--json", "--force", *REAP)
        assert run.returncode == 0, run.stdout[-2000:] + run.stderr
        assert leak_left(lab, leak) == everything, "nothing of the leak may go"
        attachment = attachments_by_key(run.doc)[(leak.container_id, leak.network, leak.ifname)]
        assert attachment["verdict"] == "excluded", attachment
        assert "disableGC" in attachment["reason"] and str(conf) in attachment["reason"], attachment["reason"]
        assert leak.container_id not in {r["container_id"] for r in run.doc["reclaimed"]}
    finally:
        conf.write_bytes(original)
    # The same leak, once the config lets it go, is reclaimed: it was the switch that kept it.
    run = run_reaper(lab, "reap", tmp_path / "state.json", "--json", *REAP)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr
    assert leak_left(lab, leak) == []
