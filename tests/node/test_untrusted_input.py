"""What a writer of the CNI cache dir can make the reaper do: nothing outside the node's own
configuration. (More of the untrusted-input issue lands here as it is built.)"""

from __future__ import annotations

import json
import re
from pathlib import Path

from reaper.kinds import FindOptions
from reaper.snapshot import take_snapshot
from tests.harness.configs import cache_doc, conflist

CID = "c" * 64


def test_a_data_dir_named_only_by_a_cached_config_is_never_read(tmp_path: Path) -> None:
    """Leases are read, and so may be released, only under --ipam-dir and the dataDirs of the
    conf dir's configs; a cached config can name any dir it likes."""
    outside = tmp_path / "outside" / "net1"
    outside.mkdir(parents=True)
    (outside / "10.0.0.9").write_bytes(f"{CID}\r\neth0".encode())
    cache_dir, conf_dir = tmp_path / "cache", tmp_path / "net.d"
    (cache_dir / "results").mkdir(parents=True)
    conf_dir.mkdir()
    config = json.loads(conflist("net1", dataDir=str(tmp_path / "outside")))
    (cache_dir / "results" / f"net1-{CID}-eth0").write_text(json.dumps(cache_doc(CID, "net1", config=config)))
    options = FindOptions((), (str(tmp_path / "ipam"),), str(cache_dir), str(conf_dir), (), (re.compile("x"),))
    assert take_snapshot(options).of("ipam") == ()
    # The same config in the conf dir is the node's own: its dataDir is read.
    (conf_dir / "10-net1.conflist").write_text(json.dumps(config))
    assert [lease.ip for lease in take_snapshot(options).of("ipam")] == ["10.0.0.9"]
