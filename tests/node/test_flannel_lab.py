"""flannel's per-container files on a real containerd: a leak's file, in the data dir the conf
dir's flannel config names, joins the leak and goes with it; a live pod's stays."""

from __future__ import annotations

import json
from pathlib import Path

from tests.harness.lab import Lab
from tests.harness.plugin_files import FLANNEL_CONF, flannel_scratch
from tests.harness.reap_helpers import REAP, SCAN, leak_left, pings
from tests.harness.reaper_cli import attachments_by_key, kinds, run_reaper


def test_a_leaks_flannel_file_goes_with_it_and_a_live_pods_stays(tmp_path: Path) -> None:
    with Lab() as lab:
        web = lab.run_pod("web")
        leak = lab.make_leak(with_cache=True)
        net = lab.network_name
        data_dir = lab.root / "flannel-data"
        data_dir.mkdir(mode=0o700)
        # After the lab's own list in libcni's order: containerd (max_conf_num 1) keeps using that.
        plugin = {"type": "flannel", "dataDir": str(data_dir)}
        flannel_list = {"cniVersion": "1.0.0", "name": "flannel-lab", "plugins": [plugin]}
        (lab.conf_dir / "99-flannel.conflist").write_text(json.dumps(flannel_list))
        data = flannel_scratch({**FLANNEL_CONF, "name": net})
        leaked = data_dir / leak.container_id
        leaked.write_bytes(data)
        (lab.cache_dir / "flannel").mkdir(mode=0o700)
        kept = lab.cache_dir / "flannel" / web
        kept.write_bytes(data)

        scan = run_reaper(lab, "scan", tmp_path / "scan.json", "--json", *SCAN)
        found = attachments_by_key(scan.doc)
        dead, live = found[(leak.container_id, net, "eth0")], found[(web, net, "eth0")]
        assert dead["verdict"] == "orphan" and "flannel" in kinds(dead)
        assert live["verdict"] == "live" and "flannel" in kinds(live)

        run = run_reaper(lab, "reap", tmp_path / "reap.json", "--json", *REAP)
        assert run.returncode == 0, run.stdout[-3000:] + run.stderr
        assert all(r["ok"] for o in run.doc["reclaimed"] for r in o["resources"])
        assert leak_left(lab, leak) == [] and not leaked.exists()
        assert kept.read_bytes() == data and pings(lab, web)
