"""Which attachments a plugin may run for at all: only those a kernel object proves. DEL's config
is chosen (del_request), and a cache entry kept (kept_state), by that rule."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from msgspec.structs import replace

from reaper.kinds import cache, hostlocal, netns
from reaper.kinds.netconf import parse_network_config
from reaper.model import Attachment, AttachmentKey, Identity, NodeSnapshot, NsKey
from reaper.options import FindOptions
from reaper.reap.requests import del_request, kept_state
from reaper.reap.trust import NO_KERNEL_EVIDENCE, NodeTrust, node_trust
from reaper.snapshot import take_snapshot
from tests.harness import snapshots
from tests.harness.configs import cache_doc, conflist
from tests.harness.passes import bare_reclaimer

CID = "a" * 64
NET = "net1"
OWN = json.loads(conflist(NET))
DHCP = {"cniVersion": "1.0.0", "name": NET, "plugins": [{"type": "bridge", "ipam": {"type": "dhcp"}}]}
NETNS = NsKey(4, 1001)
NO_PINS = (re.compile("x"),)


def _records(tmp: Path, config: dict[str, Any] = OWN) -> dict[Identity, Any]:
    """A lease and a cache entry of CID, read from files as a look reads them."""
    results = tmp / "cache" / "results"
    results.mkdir(parents=True)
    (results / f"{NET}-{CID}-eth0").write_text(json.dumps(cache_doc(CID, NET, config=config, result={})))
    (entry,) = cache.collect_cache(str(tmp / "cache"), {NET}).entries
    leases = tmp / "ipam" / NET
    leases.mkdir(parents=True)
    (leases / "10.0.0.9").write_bytes(f"{CID}\r\neth0".encode())
    (lease,) = hostlocal.collect_leases([str(tmp / "ipam")])[0]
    return {cache.identity(entry): entry, hostlocal.identity(lease): lease}


def _attachment(records: dict[Identity, Any]) -> Attachment:
    refs = []
    for record in records.values():
        kind = next(k for k in (cache.KIND, hostlocal.KIND, netns.KIND) if k.identity(record) in records)
        refs.append(replace(kind.ref(record), identity=kind.identity(record)))
    return Attachment(
        key=AttachmentKey(CID, NET, "eth0"),
        resources=tuple(refs),
        netns=NETNS,
        verdict="orphan",
        reason="",
        age_seconds=0.0,
    )


def _trust() -> NodeTrust:
    own = parse_network_config(json.dumps(OWN).encode(), f"/etc/cni/net.d/10-{NET}.conflist")
    return node_trust([own], (), set(), set())


def test_a_forged_lease_beside_a_forged_cache_entry_runs_no_plugin(tmp_path: Path) -> None:
    """The lease is a file in a dir the same writer can write: neither the entry's config nor
    the conf dir's runs, and the plan says why."""
    records = _records(tmp_path)
    own = parse_network_config(json.dumps(OWN).encode(), f"/etc/cni/net.d/10-{NET}.conflist")
    assert del_request(_attachment(records), records, [own], _trust()) == (None, NO_KERNEL_EVIDENCE)


def test_a_lease_alone_runs_no_plugin_either(tmp_path: Path) -> None:
    records = _records(tmp_path)
    lease_only = {i: r for i, r in records.items() if i[0] != "cache"}
    own = parse_network_config(json.dumps(OWN).encode(), f"/etc/cni/net.d/10-{NET}.conflist")
    assert del_request(_attachment(lease_only), lease_only, [own], _trust()) == (None, NO_KERNEL_EVIDENCE)


def test_a_real_pin_lets_the_cached_config_run(tmp_path: Path) -> None:
    records = _records(tmp_path)
    (tmp_path / "pin").touch()  # DEL is passed the pin's path, so it must be there
    pin = replace(snapshots.pin(1), path=str(tmp_path / "pin"))
    records[netns.identity(pin)] = pin
    request, note = del_request(_attachment(records), records, [], _trust())
    assert note is None and request is not None and request.source.endswith(f"{NET}-{CID}-eth0")
    stale = replace(pin, is_namespace=False)
    records[netns.identity(pin)] = stale
    assert del_request(_attachment(records), records, [], _trust()) == (None, NO_KERNEL_EVIDENCE)


def test_an_off_node_ipams_entry_stays_when_no_plugin_may_run(tmp_path: Path) -> None:
    """dhcp keeps the address off the node: only its DEL, which needs the entry, frees it. With
    no plugin allowed to run (no DEL request), the entry is kept (and reported); a host-local
    one is not."""
    records = _records(tmp_path, DHCP)
    assert kept_state(_attachment(records), records, [], None) == "dhcp"
    local = _records(tmp_path / "local")
    assert kept_state(_attachment(local), local, [], None) is None


def test_a_kept_entry_stays_with_its_reason_and_the_rest_goes(tmp_path: Path) -> None:
    """The reclaimer keeps the entry of an attachment no plugin may run for, and says why; its
    lease is freed as a file all the same."""
    records = _records(tmp_path, DHCP)
    attachment = _attachment(records)
    options = FindOptions(
        netns_dirs=(),
        ipam_dirs=(str(tmp_path / "ipam"),),
        cache_dir=str(tmp_path / "cache"),
        conf_dir=str(tmp_path / "conf"),
        bin_dirs=(),
        netns_patterns=NO_PINS,
    )
    reclaimer = bare_reclaimer(look=lambda: take_snapshot(options))
    (outcome,), skipped = reclaimer.run([attachment], {attachment.key: None}, records, {attachment.key: "dhcp"})
    assert skipped == [] and outcome.needs_plugin == "dhcp"
    done = {r.kind: r for r in outcome.resources}
    assert done["ipam"].ok and not (tmp_path / "ipam" / NET / "10.0.0.9").exists()
    assert not done["cache"].ok and "no DEL runs" in str(done["cache"].error)
    assert (tmp_path / "cache" / "results" / f"{NET}-{CID}-eth0").exists()


def test_a_kept_pinned_attachment_is_not_said_to_lack_a_pin(tmp_path: Path) -> None:
    """An attachment with a real pin whose DEL was refused (a delegate file, a cached config
    with no conf dir config to fall back on, --method kernel) keeps what its DEL needs; the
    reason says the DEL did not run, not that no pin proves the attachment."""
    records = _records(tmp_path, DHCP)
    (tmp_path / "pin").touch()
    pin = replace(snapshots.pin(1), path=str(tmp_path / "pin"))
    records[netns.identity(pin)] = pin
    attachment = _attachment(records)
    options = FindOptions(
        netns_dirs=(),
        ipam_dirs=(str(tmp_path / "ipam"),),
        cache_dir=str(tmp_path / "cache"),
        conf_dir=str(tmp_path / "conf"),
        bin_dirs=(),
        netns_patterns=NO_PINS,
    )

    def look() -> NodeSnapshot:
        seen = take_snapshot(options)
        return replace(seen, resources={**seen.resources, netns.KIND.name: (pin,)})

    reclaimer = bare_reclaimer(look=look)
    (outcome,), skipped = reclaimer.run([attachment], {attachment.key: None}, records, {attachment.key: "dhcp"})
    assert skipped == [] and outcome.needs_plugin == "dhcp"
    done = {r.kind: r for r in outcome.resources}
    # The pin stays, and the address configured in it: its lease stays with it (issue 31).
    assert not done["ipam"].ok and "stays configured in the netns" in str(done["ipam"].error)
    assert (tmp_path / "ipam" / NET / "10.0.0.9").exists()
    for kind in ("cache", "netns"):
        error = str(done[kind].error)
        assert not done[kind].ok and "that DEL does not run for it" in error and "no netns pin" not in error, error
    assert (tmp_path / "pin").exists()
