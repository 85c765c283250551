"""The address check right before acting: an orphan one of whose addresses another namespace
has configured is left, addresses compared by meaning; a namespace that cannot be read, or
processes that cannot all be seen, leave every orphan holding an address."""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping, Sequence
from typing import Any

import pytest

from reaper.host.netns_addrs import Handle, NamespaceAddresses, NamespaceToRead
from reaper.host.nsmounts import HeldMounts, NsMount
from reaper.kinds import cache, firewall, hostlocal, iptables, netns
from reaper.kinds.cache import CacheEntry
from reaper.kinds.firewall import ForwardRule
from reaper.kinds.hostlocal import HostLocalLease
from reaper.kinds.iptables import IptablesChain
from reaper.kinds.netns import NetnsPin
from reaper.model import Attachment, AttachmentKey, Identity, NsKey, ResourceRef
from reaper.reap import addresses
from reaper.reap.addresses import addresses_held, addresses_in_use, leave_for_addresses

LIVE, DEAD = "a" * 64, "d" * 64
OWN, OTHER, GONE, HOST = NsKey(4, 100), NsKey(4, 200), NsKey(4, 300), NsKey(4, 1)


def lease(ip: str, cid: str = DEAD) -> HostLocalLease:
    return HostLocalLease(
        network="net1",
        ip=ip,
        container_id=cid,
        ifname="eth0",
        path=f"/var/lib/cni/networks/net1/{ip}",
        data_dir="/var/lib/cni/networks",
        mtime=0.0,
    )


def entry(*ips: str, cid: str = DEAD) -> CacheEntry:
    path = f"/var/lib/cni/results/net1-{cid}-eth0"
    return CacheEntry(
        path=path,
        name=f"net1-{cid}-eth0",
        container_id=cid,
        network="net1",
        ifname="eth0",
        netns_path=None,
        netns=None,
        host_ifnames=(),
        legacy=False,
        mtime=0.0,
        cache_dir="/var/lib/cni",
        ips=ips,
    )


def pin(ns: NsKey, name: str = "cni-1") -> NetnsPin:
    return NetnsPin(
        name=name,
        path=f"/run/netns/{name}",
        directory="/run/netns",
        ns=ns,
        is_namespace=True,
        mtime=0.0,
        runtime_named=True,
    )


def rule(ip: str) -> ForwardRule:
    return ForwardRule(family="ipv4", backend="default", ip=ip, rule=f"-A CNI-FORWARD -s {ip}/32 -j ACCEPT")


def masquerade(*jumps: str) -> IptablesChain:
    return IptablesChain(
        family="ipv4",
        table="nat",
        chain="CNI-0123456789abcdef01234567",
        purpose="masquerade",
        network="net1",
        container_id=DEAD,
        rules=(),
        jumps=jumps,
    )


def attach(
    *records: Any, cid: str | None = DEAD, netns_key: NsKey | None = None
) -> tuple[Attachment, dict[Identity, Any]]:
    """An orphan attachment of `records`, and the records by identity as a pass indexes them."""
    kinds: dict[type, Any] = {HostLocalLease: hostlocal.KIND, CacheEntry: cache.KIND, NetnsPin: netns.KIND,
             ForwardRule: firewall.KIND, IptablesChain: iptables.KIND}  # fmt: skip
    refs, index = [], {}
    for record in records:
        kind = kinds[type(record)]
        identity = kind.identity(record)
        refs.append(ResourceRef(kind=kind.name, name=str(identity[-1]), created_at=0.0, details={}, identity=identity))
        index[identity] = record
    key = AttachmentKey(cid, "net1", "eth0") if cid is not None else AttachmentKey(None, None, None, "/run/netns/x")
    return Attachment(
        key=key, resources=tuple(refs), netns=netns_key, verdict="orphan", reason="no sandbox", age_seconds=600.0
    ), index


def seen(ns: NsKey, where: str, *found: str, error: str | None = None) -> NamespaceAddresses:
    return NamespaceAddresses(ns, where, found, error)


@pytest.mark.parametrize(
    ("held", "configured"),
    [
        ("10.0.0.5", "10.0.0.5"),
        ("10.0.0.5", "::ffff:10.0.0.5"),  # IPv4-mapped, as a v6 socket or a forged file spells it
        ("10.0.0.5", "::ffff:a00:5"),
        ("fd00::5", "fd00:0:0:0:0:0:0:5"),
        ("FD00::5", "fd00::5"),
        ("fd00:0::5", "fd00::5"),
    ],
)
def test_an_address_configured_in_another_namespace_leaves_the_orphan(held: str, configured: str) -> None:
    orphan, records = attach(lease(held), entry(f"{held}/24"))
    reasons = leave_for_addresses(
        {orphan.key: addresses_held(orphan, records)},
        [seen(HOST, "the netns the reaper runs in", "192.0.2.2"), seen(OTHER, "the netns of pid 4242", configured)],
        None,
    )
    canonical = ipaddress.ip_address(held)
    where = "the netns of pid 4242, not its own: a live pod holds it"
    assert reasons == {orphan.key: f"its address {canonical} is configured in {where}"}


def test_addresses_in_its_own_pin_or_a_dead_pin_or_nowhere_leave_nothing() -> None:
    orphan, records = attach(lease("10.0.0.5"), pin(OWN))
    split, split_records = attach(lease("10.0.0.6", cid=LIVE), cid=LIVE)
    held = {orphan.key: addresses_held(orphan, records), split.key: addresses_held(split, split_records)}
    found = [seen(HOST, "host", "192.0.2.2"), seen(OWN, "its pin", "10.0.0.5"), seen(GONE, "a dead pin", "10.0.0.6")]
    # Its own pin goes with it this pass (dead, as addresses_in_use finds it: no process inside,
    # no mount elsewhere).
    assert leave_for_addresses(held, found, None, dead=frozenset({GONE, OWN})) == {}
    # The dead pin is only dead for what it proves: its address in a live namespace still counts.
    assert set(leave_for_addresses(held, found, None, dead=frozenset({OWN}))) == {split.key}


def test_its_own_namespace_that_outlives_the_pass_keeps_its_address() -> None:
    """antrea#8239's failure mode: the orphan's own namespace stays (a mount elsewhere holds it,
    its pin gone; a process is inside) with its address configured: the lease stays with it."""
    orphan, records = attach(lease("10.0.0.5"), pin(OWN))
    held = {orphan.key: addresses_held(orphan, records)}
    found = [seen(OWN, "the netns held by a mount at /x", "10.0.0.5")]
    reasons = leave_for_addresses(held, found, None)
    assert reasons == {
        orphan.key: "its address 10.0.0.5 is still configured in its own namespace, the netns held by a mount at"
        " /x, which this pass does not free"
    }
    assert leave_for_addresses(held, [seen(OWN, "x", "10.0.0.9")], None) == {}  # another address there: no hold


def test_a_namespace_that_could_not_be_read_leaves_every_orphan_holding_an_address() -> None:
    holding, records = attach(lease("10.0.0.5"), entry("10.0.0.5"))
    bare, bare_records = attach(pin(OWN), cid=None)
    held = {holding.key: addresses_held(holding, records), bare.key: addresses_held(bare, bare_records)}
    found = [seen(OTHER, "the netns of pid 7", error="Permission denied"), seen(HOST, "host", "192.0.2.2")]
    reasons = leave_for_addresses(held, found, None)
    assert reasons == {
        holding.key: "the addresses configured in the netns of pid 7 could not be read (Permission denied): whether"
        " a live pod holds its address 10.0.0.5 cannot be told"
    }
    # Its own namespace unreadable proves nothing either way: not a reason to leave it.
    own, own_records = attach(rule("10.0.0.5"), pin(OTHER))
    assert leave_for_addresses({own.key: addresses_held(own, own_records)}, found, None) == {}


def test_processes_that_cannot_all_be_seen_leave_every_orphan_holding_an_address() -> None:
    orphan, records = attach(rule("10.0.0.5"))
    reasons = leave_for_addresses({orphan.key: addresses_held(orphan, records)}, [], "the walk of /proc failed")
    assert list(reasons) == [orphan.key] and "cannot be told" in reasons[orphan.key]


def test_loopback_link_local_and_junk_are_no_pods_address() -> None:
    orphan, records = attach(
        entry("127.0.0.1", "::1", "fe80::1", "0.0.0.0", "224.0.0.1", "not-an-ip", "::ffff:127.0.0.1")
    )
    held = addresses_held(orphan, records)
    assert held.addresses == ()
    found = [seen(HOST, "host", "127.0.0.1", "::1", "fe80::1")]
    assert leave_for_addresses({orphan.key: held}, found, None) == {}


def test_every_record_that_frees_an_address_is_counted_and_its_pins_are_its_own() -> None:
    chain = "CNI-0123456789abcdef01234567"
    jumps = (
        f'-A POSTROUTING -s 10.0.0.8/32 -m comment --comment "name: \\"net1\\" id: \\"x\\"" -j {chain}',
        f"-A POSTROUTING ! -s 10.0.0.99/32 -j {chain}",
    )
    orphan, records = attach(lease("10.0.0.5"), entry("fd00::6/64"), rule("10.0.0.7"), masquerade(*jumps), pin(OWN),
                             netns_key=OTHER)  # fmt: skip
    held = addresses_held(orphan, records)
    # Not the cache entry's: a writer of the file can name any address there (see the next test).
    assert sorted(map(str, held.addresses)) == ["10.0.0.5", "10.0.0.7", "10.0.0.8"]
    assert held.own == {OWN, OTHER}


def test_a_live_address_written_into_a_leaks_cache_entry_keeps_nothing() -> None:
    """A writer of /var/lib/cni puts a live pod's address into a real leak's cache entry: the
    leak (its lease, its chain, with its own address) is still reclaimed, never kept for good."""
    jump = "-A POSTROUTING -s 10.0.0.5/32 -j CNI-0123456789abcdef01234567"
    orphan, records = attach(lease("10.0.0.5"), entry("10.0.0.77"), masquerade(jump), pin(OWN))
    found = [seen(OWN, "its pin", "10.0.0.5"), seen(OTHER, "the netns of pid 7", "10.0.0.77")]
    assert leave_for_addresses({orphan.key: addresses_held(orphan, records)}, found, None, frozenset({OWN})) == {}
    forged, forged_records = attach(entry("10.0.0.77"), cid=LIVE)
    assert addresses_held(forged, forged_records).addresses == ()


def _fake_node(
    monkeypatch: pytest.MonkeyPatch,
    members: Mapping[NsKey, set[int]],
    pins: Sequence[NetnsPin],
    configured: Mapping[NsKey, tuple[str, ...]],
    mounted: Sequence[NsMount] = (),
) -> list[list[NamespaceToRead]]:
    """The node as addresses_in_use sees it (`mounted`: the mounts of network namespaces in
    every mount namespace); what it asked to read, call by call."""
    asked: list[list[NamespaceToRead]] = []

    def read(targets: Sequence[NamespaceToRead], **_: Any) -> list[NamespaceAddresses]:
        asked.append(list(targets))
        return [NamespaceAddresses(t.ns, t.where, configured.get(t.ns, ())) for t in targets]

    monkeypatch.setattr(addresses, "unseen_processes", lambda: None)
    monkeypatch.setattr(addresses, "netns_members", lambda: {k: set(v) for k, v in members.items()})
    monkeypatch.setattr(addresses, "collect_pins", lambda dirs, patterns: (list(pins), []))
    monkeypatch.setattr(addresses, "this_threads_netns", lambda: HOST)
    monkeypatch.setattr(addresses, "read_addresses", read)
    monkeypatch.setattr(addresses, "held_mounts", lambda dirs: _walked(mounted))
    return asked


def _walked(mounts: Sequence[NsMount]) -> HeldMounts:
    """held_mounts' answer where each of `mounts` (no pin) holds its namespace."""
    held: dict[NsKey, tuple[NsMount, ...]] = {}
    for m in mounts:
        held[m.ns] = (*held.get(m.ns, ()), m)
    return HeldMounts(held=held, shared={})


def test_no_orphan_holding_an_address_reads_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    asked = _fake_node(monkeypatch, {}, [], {})
    orphan, records = attach(pin(OWN), cid=None)
    assert addresses_in_use([orphan], records, ("/run/netns",)) == {} and asked == []


def test_a_split_off_lease_of_a_pin_reclaimed_this_pass_goes_and_one_a_process_holds_stays(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A runtime that forgot a sandbox: its pin and its lease are two orphans, the lease's address
    in the pin's namespace. With nothing inside the pin, the lease goes; with a process inside
    (a container whose cache entry was edited), it stays, by pid."""
    dead_pin = pin(GONE, "cni-dead")
    pinned, pin_records = attach(dead_pin, cid=None)
    split, split_records = attach(lease("10.0.0.6"))
    records = {**pin_records, **split_records}
    node = {GONE: ("10.0.0.6",), HOST: ("192.0.2.2",)}
    asked = _fake_node(monkeypatch, {HOST: {1}}, [dead_pin], node)
    assert addresses_in_use([pinned, split], records, ("/run/netns",)) == {}
    assert [t.ns for t in asked[0]] == [HOST], "the dead pin is not even read"

    asked = _fake_node(monkeypatch, {HOST: {1}, GONE: {4242}}, [dead_pin], node)
    reasons = addresses_in_use([pinned, split], records, ("/run/netns",))
    assert reasons == {
        split.key: "its address 10.0.0.6 is configured in the netns pinned at /run/netns/cni-dead (pid 4242 inside),"
        " not its own: a live pod holds it"
    }
    (targets,) = asked
    assert [(t.ns, [h.path for h in t.handles]) for t in targets] == [
        (HOST, []),
        (GONE, ["/run/netns/cni-dead", "/proc/4242/ns/net"]),
    ]


def test_a_walk_of_proc_that_fails_leaves_them_all(monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_node(monkeypatch, {}, [], {})

    def fails() -> dict[NsKey, set[int]]:
        raise OSError(5, "/proc lists no process")

    monkeypatch.setattr(addresses, "netns_members", fails)
    orphan, records = attach(lease("10.0.0.5"))
    reasons = addresses_in_use([orphan], records, ("/run/netns",))
    assert "the walk of /proc failed" in reasons[orphan.key] and "10.0.0.5 cannot be told" in reasons[orphan.key]


def test_a_namespace_a_mount_holds_is_read_through_its_holder_or_counts_as_unread(tmp_path: Any) -> None:
    """A namespace held by a mount elsewhere is read through the holder's root; one whose only
    mounts lie below a filesystem that may wait on a process gets a way that opens nothing, so
    it is unread (and its orphans' addresses undecided), never the namespace read from."""
    walkable = NsMount(ns=NsKey(4, 71), pid=12, mount_ns=9, mount_point="/var/held", on=None)
    below_fuse = NsMount(ns=NsKey(4, 72), pid=13, mount_ns=9, mount_point="/fuse/held", on=None, reachable=False)
    targets = addresses.node_namespaces(
        (str(tmp_path),), {}, frozenset(), {walkable.ns: (walkable,), below_fuse.ns: (below_fuse,)}
    )
    by_ns = {t.ns: t for t in targets}
    assert by_ns[walkable.ns].handles == (Handle("/var/held", pinned=True, beneath="/proc/12/root"),)
    assert "pid 12" in by_ns[walkable.ns].where and "/var/held" in by_ns[walkable.ns].where
    assert by_ns[below_fuse.ns].handles == (Handle(addresses.UNREACHABLE, pinned=False),)


def test_only_a_namespace_every_process_of_which_is_a_handle_may_read_as_gone(tmp_path: Any) -> None:
    """A namespace found only through processes, each of them a handle, reads as empty once
    they have all exited; one with more processes than handles, or also held by a mount, never."""
    few, many, mounted_too = NsKey(4, 81), NsKey(4, 82), NsKey(4, 83)
    mount = NsMount(ns=mounted_too, pid=12, mount_ns=9, mount_point="/var/held", on=None)
    members = {few: {30, 31}, many: set(range(40, 40 + addresses.HANDLES + 1)), mounted_too: {50}}
    targets = addresses.node_namespaces((str(tmp_path),), members, frozenset(), {mounted_too: (mount,)})
    by_ns = {t.ns: t for t in targets}
    assert by_ns[few].only_processes
    assert not by_ns[many].only_processes and not by_ns[mounted_too].only_processes


def test_an_address_configured_in_a_namespace_only_a_mount_holds_keeps_the_orphan(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Its pin gone, a pod's namespace held by a mount in another mount namespace still has the
    address: the lease split from it stays. A mount walk that cannot be whole leaves it too."""
    held_ns = NsKey(4, 77)
    mount = NsMount(ns=held_ns, pid=12, mount_ns=9, mount_point="/var/held", on=None)
    _fake_node(monkeypatch, {HOST: {1}}, [], {held_ns: ("10.0.0.5/24",)}, [mount])
    orphan, records = attach(lease("10.0.0.5"))
    why = addresses_in_use([orphan], records, ("/run/netns",))[orphan.key]
    assert "10.0.0.5" in why and "pid 12" in why and "/var/held" in why

    def fails(dirs: tuple[str, ...]) -> HeldMounts:
        raise OSError(5, "mount namespace mnt:[9] cannot be entered")

    monkeypatch.setattr(addresses, "held_mounts", fails)
    why = addresses_in_use([orphan], records, ("/run/netns",))[orphan.key]
    assert "mounts of every mount namespace cannot be read" in why


def test_a_namespace_a_user_without_root_made_keeps_nothing() -> None:
    """Its addresses are its owner's own (never read in fact: the reader reports only who made
    it), and one it could not read would not count either."""
    orphan, records = attach(lease("10.0.0.5"))
    held = {orphan.key: addresses_held(orphan, records)}
    users = [
        NamespaceAddresses(OTHER, "the netns of pid 7", ("10.0.0.5",), None, 65534),
        NamespaceAddresses(GONE, "the netns of pid 8", (), "Permission denied", 1000),
    ]
    assert leave_for_addresses(held, users, None) == {}


def test_an_unread_namespace_only_users_mounts_hold_keeps_only_its_own_attachment() -> None:
    """It may be a pod's pin a user bind-mounted: the attachment it is the namespace of stays,
    and no other orphan on the node does."""
    own, own_records = attach(lease("10.0.0.6", cid=LIVE), cid=LIVE, netns_key=OTHER)
    other, other_records = attach(lease("10.0.0.5"))
    held = {own.key: addresses_held(own, own_records), other.key: addresses_held(other, other_records)}
    unread = NamespaceAddresses(OTHER, "the netns held by a mount at /b/status", (), "No such file", None, 65534)
    reasons = leave_for_addresses(held, [unread, seen(HOST, "host", "192.0.2.2")], None)
    assert list(reasons) == [own.key]
    assert "its own namespace" in reasons[own.key] and "uid 65534" in reasons[own.key]
    # Made by root (or by no one the reaper can name), unread: every orphan stays, as before.
    root = NamespaceAddresses(OTHER, "the netns held by a mount at /x", (), "No such file")
    assert set(leave_for_addresses(held, [root], None)) == {other.key}


def test_a_namespace_is_marked_a_users_only_when_every_mount_of_it_is_a_users() -> None:
    users = {9: 65534, 10: None}  # mount namespace -> who made it
    mine = NsMount(ns=NsKey(4, 81), pid=12, mount_ns=9, mount_point="/b/status", on=None, reachable=False)
    roots = NsMount(ns=NsKey(4, 82), pid=13, mount_ns=10, mount_point="/held", on=None)
    both = (NsMount(ns=NsKey(4, 83), pid=12, mount_ns=9, mount_point="/b/x", on=None), roots)
    mounted = {mine.ns: (mine,), roots.ns: (roots,), NsKey(4, 83): both}
    targets = addresses.node_namespaces(("/nonexistent",), {}, frozenset(), mounted, lambda m: users[m.mount_ns])
    by_ns = {t.ns: t.mounted_by_user for t in targets if t.handles}  # not the one the reader starts in
    assert by_ns == {mine.ns: 65534, roots.ns: None, NsKey(4, 83): None}


def test_only_the_orphans_addresses_are_asked_for_in_every_spelling_the_kernel_holds(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    asked: list[frozenset[bytes] | None] = []

    def read(targets: Sequence[NamespaceToRead], **kw: Any) -> list[NamespaceAddresses]:
        asked.append(kw.get("wanted"))
        return [NamespaceAddresses(t.ns, t.where, ()) for t in targets]

    _fake_node(monkeypatch, {HOST: {1}}, [], {})
    monkeypatch.setattr(addresses, "read_addresses", read)
    orphan, records = attach(lease("10.0.0.5"), rule("fd00::5"))
    assert addresses_in_use([orphan], records, ("/run/netns",)) == {}
    v4, v6 = ipaddress.ip_address("10.0.0.5"), ipaddress.ip_address("fd00::5")
    mapped = ipaddress.ip_address("::ffff:10.0.0.5")
    assert asked == [frozenset({v4.packed, mapped.packed, v6.packed})]


def test_a_mount_in_a_users_pinned_mount_namespace_is_that_users(monkeypatch: pytest.MonkeyPatch) -> None:
    """A mount namespace no process is in has no pid to ask: the maker the walk told is used,
    and no process is asked."""
    asked: list[int] = []
    monkeypatch.setattr(addresses, "mount_namespace_owners", lambda pid, ns: asked.append(pid))
    pinned = NsMount(
        ns=NsKey(4, 4026532010), pid=0, mount_ns=4026532999, mount_point="/run/x", on=None, made_by_user=65534
    )
    assert addresses.mounting_user(pinned) == 65534 and asked == []
    root_pinned = NsMount(ns=NsKey(4, 4026532010), pid=0, mount_ns=4026532999, mount_point="/run/x", on=None)
    assert addresses.mounting_user(root_pinned) is None


def test_its_own_pin_a_mount_elsewhere_also_holds_is_read_and_keeps_its_lease(monkeypatch: pytest.MonkeyPatch) -> None:
    """An orphan's own pin that a mount in another mount namespace also holds outlives the
    unpin: it is neither dead nor skipped, so it is read, and its address there keeps the lease."""
    own_pin = pin(GONE, "cni-held")
    orphan, records = attach(lease("10.0.0.6"), own_pin)
    elsewhere = NsMount(ns=GONE, pid=12, mount_ns=9, mount_point="/var/held", on=None)
    asked = _fake_node(monkeypatch, {HOST: {1}}, [own_pin], {GONE: ("10.0.0.6",)}, [elsewhere])
    monkeypatch.setattr(addresses, "mounting_user", lambda mount: None)
    reasons = addresses_in_use([orphan], records, ("/run/netns",))
    assert list(reasons) == [orphan.key] and "still configured in its own namespace" in reasons[orphan.key]
    assert GONE in [t.ns for t in asked[0]]
    # Held by nothing but its pin: dead, not read, the lease goes with it.
    asked = _fake_node(monkeypatch, {HOST: {1}}, [own_pin], {GONE: ("10.0.0.6",)})
    assert addresses_in_use([orphan], records, ("/run/netns",)) == {}
    assert GONE not in [t.ns for t in asked[0]]


def _proc_target(ns: NsKey, *pids: int) -> NamespaceToRead:
    handles = tuple(Handle(f"/proc/{pid}/ns/net", pinned=False) for pid in pids)
    return NamespaceToRead(ns, f"the netns of pid {pids[0]}", handles)


def test_a_namespace_whose_first_processes_left_while_read_is_read_again_through_the_others() -> None:
    """A namespace with more processes than HANDLES whose lowest pids exited while it was read
    (found on a loaded node: every orphan was left for one such namespace): one more walk, and
    it is read through the processes in it now; gone from that walk, it is read as empty. A pin
    or a mount keeps the first error, as does a namespace that fails again."""
    churning, emptied, pinned, stubborn = NsKey(4, 1), NsKey(4, 2), NsKey(4, 3), NsKey(4, 4)
    targets = [
        _proc_target(churning, 10, 11, 12, 13),
        _proc_target(emptied, 20, 21, 22, 23),
        NamespaceToRead(pinned, "the netns pinned at /run/netns/x", (Handle("/run/netns/x", pinned=True),)),
        _proc_target(stubborn, 40, 41, 42, 43),
    ]
    seen = [NamespaceAddresses(t.ns, t.where, (), "No such file or directory") for t in targets]
    asked: list[NamespaceToRead] = []

    def read(again: Sequence[NamespaceToRead]) -> list[NamespaceAddresses]:
        asked.extend(again)
        return [
            NamespaceAddresses(
                t.ns, t.where, ("10.0.0.9",) if t.ns == churning else (), "gone" if t.ns == stubborn else None
            )
            for t in again
        ]

    now = {churning: {14, 15, 16, 17, 18}, stubborn: {44}}
    out = addresses.reread_churned(targets, seen, lambda: now, read)
    assert [t.ns for t in asked] == [churning, stubborn], "only namespaces found through processes alone"
    assert [h.path for h in asked[0].handles] == [f"/proc/{pid}/ns/net" for pid in (14, 15, 16, 17)]
    assert (out[0].addresses, out[0].error) == (("10.0.0.9",), None), "read through the processes in it now"
    assert (out[1].addresses, out[1].error) == ((), None), "no process left, no pin, no mount: empty"
    assert out[2].error == "No such file or directory", "a pinned namespace keeps its error"
    assert out[3].error == "gone", "failing again keeps it unread"


def test_a_namespace_whose_mount_went_while_read_is_looked_up_again(monkeypatch: pytest.MonkeyPatch) -> None:
    """A namespace found only through a mount elsewhere whose holder exited (or unmounted it)
    before it was read (found on a loaded node: every orphan was left for another test's
    namespace). One more walk: held by nothing now, it reads as empty and the orphan goes; held
    by a mount still, it is read again through that mount; a walk that fails keeps the error."""
    held_ns = NsKey(4, 78)
    first = NsMount(ns=held_ns, pid=12, mount_ns=9, mount_point="/var/held", on=None)
    then = NsMount(ns=held_ns, pid=13, mount_ns=10, mount_point="/var/moved", on=None)
    orphan, records = attach(lease("10.0.0.5"))
    walks: list[list[NsMount]] = []
    asked = _fake_node(monkeypatch, {HOST: {1}}, [], {held_ns: ("10.0.0.5/24",)})

    def read(targets: Sequence[NamespaceToRead], **_: Any) -> list[NamespaceAddresses]:
        asked.append(list(targets))
        return [
            NamespaceAddresses(t.ns, t.where, (), "No such file or directory")
            if any(h.beneath == "/proc/12/root" for h in t.handles)
            else NamespaceAddresses(t.ns, t.where, ("10.0.0.5",) if t.ns == held_ns else ())
            for t in targets
        ]

    monkeypatch.setattr(addresses, "read_addresses", read)
    monkeypatch.setattr(addresses, "held_mounts", lambda dirs: _walked(walks.pop(0)))
    monkeypatch.setattr(addresses, "mounting_user", lambda mount: None)
    walks.extend([[first], []])
    assert addresses_in_use([orphan], records, ("/run/netns",)) == {}, "gone from the new walk: empty"
    assert [t.ns for t in asked[-1]] == [HOST, held_ns] and not walks

    walks.extend([[first], [then]])
    why = addresses_in_use([orphan], records, ("/run/netns",))[orphan.key]
    assert "10.0.0.5 is configured in the netns held by a mount at /var/moved" in why
    assert [h.beneath for h in asked[-1][0].handles] == ["/proc/13/root"]

    def fails(dirs: tuple[str, ...]) -> HeldMounts:
        if walks:
            return _walked(walks.pop(0))
        raise OSError(5, "mount namespace mnt:[10] cannot be entered")

    monkeypatch.setattr(addresses, "held_mounts", fails)
    walks.append([first])
    why = addresses_in_use([orphan], records, ("/run/netns",))[orphan.key]
    assert "held by a mount at /var/held" in why and "could not be read (No such file or directory)" in why


def test_a_namespace_only_a_mount_below_an_unwalked_filesystem_holds_stays_unread(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Its one way (UNREACHABLE) opens nothing and looks like a process's path: the new walk of
    /proc, which finds no process in it, must not read it as empty. It stays unread, and every
    orphan holding an address is left."""
    below = NsMount(ns=NsKey(4, 72), pid=13, mount_ns=9, mount_point="/fuse/held", on=None, reachable=False)
    _fake_node(monkeypatch, {HOST: {1}}, [], {}, [below])
    monkeypatch.setattr(addresses, "mounting_user", lambda mount: None)
    asked: list[list[NamespaceToRead]] = []

    def read(targets: Sequence[NamespaceToRead], **_: Any) -> list[NamespaceAddresses]:
        asked.append(list(targets))
        unread = "No such file or directory"
        return [NamespaceAddresses(t.ns, t.where, (), unread if t.handles else None) for t in targets]

    monkeypatch.setattr(addresses, "read_addresses", read)
    orphan, records = attach(lease("10.0.0.5"))
    why = addresses_in_use([orphan], records, ("/run/netns",))[orphan.key]
    assert "held by a mount at /fuse/held" in why and "could not be read (No such file or directory)" in why
    assert all(h.path == addresses.UNREACHABLE for reads in asked[1:] for t in reads for h in t.handles)


@pytest.mark.parametrize("found_through", ["a pin", "a process and a mount elsewhere"])
def test_a_namespace_removed_while_read_is_looked_up_again(monkeypatch: pytest.MonkeyPatch, found_through: str) -> None:
    """A pod removed while the pass read (found churning pods on a loaded node: every orphan was
    left, "could not be read (Permission denied)"): its pin unlinked and its process gone, every
    way to its namespace failed, the last one's error shown (the root of a protected init, where
    a copy of the pin was seen). One more walk: held by nothing now, it reads as empty and the
    orphan goes; held still, it is read again; a walk that fails keeps the error."""
    removed = pin(OTHER, "cni-removed")
    held = NsMount(ns=OTHER, pid=1, mount_ns=0, mount_point="/run/netns/cni-removed", on=None)
    pinned = found_through == "a pin"
    first_pins, first_mounts = ([removed], []) if pinned else ([], [held])
    orphan, records = attach(lease("10.0.0.5"))
    _fake_node(monkeypatch, {}, [], {})
    monkeypatch.setattr(addresses, "mounting_user", lambda mount: None)
    members: list[dict[NsKey, set[int]]] = []
    pins: list[list[NetnsPin]] = []
    mounts: list[list[NsMount]] = []
    monkeypatch.setattr(addresses, "netns_members", lambda: members.pop(0))
    monkeypatch.setattr(addresses, "collect_pins", lambda dirs, patterns: (pins.pop(0), []))
    monkeypatch.setattr(addresses, "held_mounts", lambda dirs: _walked(mounts.pop(0)))
    asked: list[list[NamespaceToRead]] = []

    def read(targets: Sequence[NamespaceToRead], **_: Any) -> list[NamespaceAddresses]:
        again = bool(asked)
        asked.append(list(targets))
        return [
            NamespaceAddresses(t.ns, t.where, (), "Permission denied")
            if t.ns == OTHER and not again
            else NamespaceAddresses(t.ns, t.where, ("10.0.0.5",) if t.ns == OTHER else ())
            for t in targets
        ]

    monkeypatch.setattr(addresses, "read_addresses", read)
    members.extend([{HOST: {1}, OTHER: {4242}}, {HOST: {1}}])
    pins.extend([first_pins, []])
    mounts.extend([first_mounts, []])
    assert addresses_in_use([orphan], records, ("/run/netns",)) == {}, "gone from the new walk: empty"
    assert [[t.ns for t in reads] for reads in asked] == [[HOST, OTHER]] and not members and not pins

    asked.clear()
    members.extend([{HOST: {1}, OTHER: {4242}}, {HOST: {1}, OTHER: {4343}}])
    pins.extend([first_pins, []])
    mounts.extend([first_mounts, []])
    why = addresses_in_use([orphan], records, ("/run/netns",))[orphan.key]
    assert "10.0.0.5 is configured in the netns of pid 4343" in why, "read again through what holds it now"

    def fails(dirs: object) -> HeldMounts:
        if mounts:
            return _walked(mounts.pop(0))
        raise OSError(5, "mount namespace mnt:[10] cannot be entered")

    monkeypatch.setattr(addresses, "held_mounts", fails)
    asked.clear()
    members.extend([{HOST: {1}, OTHER: {4242}}])
    pins.extend([first_pins])
    mounts.extend([first_mounts])
    why = addresses_in_use([orphan], records, ("/run/netns",))[orphan.key]
    assert "could not be read (Permission denied)" in why and len(asked) == 1
