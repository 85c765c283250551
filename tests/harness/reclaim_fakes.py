"""Fakes for unit tests of the reclaim path: a node of fake resources with kinds whose reclaim
the test steers, a liveness source that answers from a script, a plugin that is a shell script,
and the settings and scan results a pass is built from.

The fake kinds are a registry of their own (FakeNode.registry), which a test hands to the pass
or the reclaimer as the node's is handed to them, so the reclaim path runs as it does on a node
while the test decides what each reclaim frees, leaves or raises."""

from __future__ import annotations

import json
import re
import stat
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from msgspec import Struct

from reaper.cni.requests import DelRequest
from reaper.kinds import Kind, Look, ReclaimContext
from reaper.kinds.netns import NetnsPin
from reaper.kinds.registry import Registry
from reaper.model import (
    Attachment,
    AttachmentKey,
    Done,
    Identity,
    NodeSnapshot,
    NsKey,
    Policy,
    ResourceRef,
    RuntimeView,
    ScanReport,
    ScanResult,
    Verdict,
)
from reaper.options import FindOptions, ReapPolicy
from reaper.settings import ReapSettings, Settings
from tests.harness.snapshots import HOST, cid

FAKE = "fake"  # a kind reclaimed in registry order
FAKE_LAST = "fakelast"  # a kind reclaimed last, like the cache entry
FAKE_PIN = "fakepin"  # the registry's pins: records that keep a namespace (keeps_netns) and a DEL needs
FAKE_LEASE = "fakelease"  # a kind with_addresses, like a lease, reclaimed after the pins


class FakeRecord(Struct, frozen=True):
    kind: str
    name: str
    addresses: tuple[str, ...] = ()  # what a FAKE_LEASE record frees


Record = FakeRecord | NetnsPin  # a FAKE_PIN record is a pin, as the netns kind finds one


def _fake_pin(name: str, ns: NsKey) -> NetnsPin:
    """A FAKE_PIN record: a namespace pinned at a path under /fake (never opened)."""
    return NetnsPin(
        name=name, path=f"/fake/{name}", directory="/fake", ns=ns, is_namespace=True, mtime=0.0, runtime_named=True
    )


def _identity(record: Record) -> Identity:
    return (record.kind, record.name) if isinstance(record, FakeRecord) else (FAKE_PIN, record.name)


def _ref(record: Record) -> ResourceRef:
    identity = _identity(record)
    return ResourceRef(kind=str(identity[0]), name=record.name, created_at=None, identity=identity)


def _keeps_netns(record: Record) -> NsKey | None:
    return record.ns if isinstance(record, NetnsPin) else None


def _frees(record: Record) -> tuple[str, ...]:
    return record.addresses if isinstance(record, FakeRecord) else ()


class FakeNode:
    """Fake records on a fake node. A kind's reclaim removes what it is handed, except the
    names in `leave` (left with that reason), `raise_on` (the reclaim raises when handed it) and
    `lie` (said freed, still there). A record in `freed_by` is gone from every look once its
    marker file exists (a fake plugin's DEL makes it); `partly_read` is what the looks say they
    could not read whole."""

    def __init__(self) -> None:
        self.records: dict[Identity, Record] = {}
        self.leave: dict[str, str] = {}
        self.raise_on: set[str] = set()
        self.lie: set[str] = set()
        self.freed_by: dict[Identity, Path] = {}
        self.partly_read: frozenset[str] = frozenset()
        self.batches: list[list[str]] = []  # the names each reclaim call was handed
        self.contexts: list[ReclaimContext] = []  # the context each reclaim call was handed
        self.looks = 0
        self.registry = Registry(kinds=())
        self.use(
            (
                self._kind(FAKE_PIN, del_needs=True, keeps_netns=_keeps_netns),
                self._kind(FAKE),
                self._kind(FAKE_LEASE, with_addresses=True, frees=_frees),
                self._kind(FAKE_LAST, last=True),
            )
        )

    @property
    def kinds(self) -> tuple[Kind[Any], ...]:
        return self.registry.kinds

    def use(self, kinds: tuple[Kind[Any], ...]) -> None:
        """`kinds` as the node's (node.registry), FAKE_PIN's the registry's pins."""
        self.registry = Registry(kinds=kinds, pins=next(k for k in kinds if k.name == FAKE_PIN))

    def _kind(self, name: str, **hooks: Any) -> Kind[Record]:
        def find(_look: Look) -> Any:
            raise AssertionError("fake kinds are never found through a Look")

        return Kind(
            name=name, find=find, identity=_identity, ref=_ref, tie=lambda _r: None, reclaim=self._reclaim, **hooks
        )

    def _reclaim(self, records: Sequence[Record], ctx: ReclaimContext) -> Mapping[Identity, Done]:
        self.batches.append([r.name for r in records])
        self.contexts.append(ctx)
        if any(r.name in self.raise_on for r in records):
            raise RuntimeError(f"reclaim of {', '.join(r.name for r in records if r.name in self.raise_on)} broke")
        done: dict[Identity, Done] = {}
        for r in records:
            if r.name in self.leave:
                done[_identity(r)] = Done.left(self.leave[r.name])
                continue
            if r.name not in self.lie:
                self.records.pop(_identity(r), None)
            done[_identity(r)] = Done.freed()
        return done

    def add(self, name: str, kind: str = FAKE, ns: NsKey | None = None, addresses: tuple[str, ...] = ()) -> ResourceRef:
        record: Record = (
            _fake_pin(name, ns) if kind == FAKE_PIN and ns is not None else FakeRecord(kind, name, addresses)
        )
        self.records[_identity(record)] = record
        return _ref(record)

    def look(self) -> NodeSnapshot:
        self.looks += 1
        by_kind: dict[str, tuple[Record, ...]] = {FAKE_PIN: (), FAKE: (), FAKE_LEASE: (), FAKE_LAST: ()}
        for ident, marker in self.freed_by.items():
            if marker.exists():
                self.records.pop(ident, None)
        for ident, record in self.records.items():
            by_kind[str(ident[0])] += (record,)
        return NodeSnapshot(
            taken_at=10_000.0,
            host_netns=HOST,
            resources=dict(by_kind),
            ranges=(),
            configs=(),
            corrupt=(),
            errors=(),
            partly_read=self.partly_read,
        )

    def attachment(self, n: int, *refs: ResourceRef, verdict: Verdict = "orphan", network: str = "mynet") -> Attachment:
        """Attachment `n` (container cid(n), `network`, eth0) of the given resources, in a
        namespace of its own (as a pod's is: the breaker weighs only those)."""
        return Attachment(
            key=AttachmentKey(cid(n), network, "eth0"),
            resources=refs,
            netns=NsKey(4, 5000 + n),
            verdict=verdict,
            reason="test",
            age_seconds=3600.0,
        )


class FakeLiveness:
    """A liveness source answering from a script of views: each observe() takes the next one,
    and the last one repeats."""

    def __init__(self, *views: RuntimeView) -> None:
        self.views = list(views)
        self.calls = 0

    def observe(self, known_netns: Mapping[str, str]) -> RuntimeView:
        view = self.views[min(self.calls, len(self.views) - 1)]
        self.calls += 1
        return view

    def ask(self, known_netns: Mapping[str, str]) -> Callable[[], RuntimeView]:
        return lambda: self.observe(known_netns)


def fake_settings(tmp_path: Path, bin_dirs: tuple[str, ...] = ()) -> Settings:
    """Settings whose dirs are under tmp_path (none of them is read: the tests fake the looks)."""
    return Settings(
        find=FindOptions(
            netns_dirs=(str(tmp_path / "netns"),),
            ipam_dirs=(str(tmp_path / "ipam"),),
            cache_dir=str(tmp_path / "cache"),
            conf_dir=str(tmp_path / "net.d"),
            bin_dirs=bin_dirs,
            netns_patterns=(re.compile("cni-.*"),),
        ),
        runtime_endpoints=("unix:///test.sock",),
        runtime_timeout=1.0,
        policy=Policy(min_age=600.0, confirmations=2, stuck_after=3600.0),
        state_file=str(tmp_path / "state"),
        json_output=False,
        log_format="text",
        log_level="info",
    )


def reap_settings(
    *, max_reap: int = 50, max_orphan_ratio: float = 0.6, force: bool = False, dry_run: bool = False
) -> ReapSettings:
    return ReapSettings(
        policy=ReapPolicy(
            max_reap=max_reap, max_orphan_ratio=max_orphan_ratio, kernel_only=False, quarantine_dir=None, force=force
        ),
        plugin_timeout=5.0,
        dry_run=dry_run,
    )


def scan_result(report: ScanReport, snap: NodeSnapshot, *, state_saved: bool = True) -> ScanResult:
    return ScanResult(
        report=report,
        snapshot=snap,
        known_netns={},
        state_saved=state_saved,
        warnings=(),
        seconds=0.0,
        timings=(("scan", 0.0),),
    )


def report_of(view: RuntimeView, *attachments: Attachment, **more: Any) -> ScanReport:
    return ScanReport(
        taken_at=10_000.0,
        runtime=view,
        attachments=attachments,
        stuck_sandboxes=more.pop("stuck_sandboxes", ()),
        corrupt=more.pop("corrupt", ()),
        errors=more.pop("errors", ()),
        ranges=more.pop("ranges", ()),
        foreign_pins=more.pop("foreign_pins", ()),
        unconfirmed=more.pop("unconfirmed", ()),
    )


def fake_plugin(
    bin_dir: Path, name: str = "fakeplugin", *, status_error: str | None = None, del_fails: bool = False
) -> Path:
    """A CNI plugin that is a shell script: it appends each verb it is run with to `<name>.log`
    beside it, answers STATUS with `status_error` (code 50) when given, and fails DEL when asked;
    a DEL that succeeds leaves the marker `deleted-<container ID>` beside it (see FakeNode.freed_by)."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    log = bin_dir / f"{name}.log"
    status = (
        f"echo '{json.dumps({'cniVersion': '1.1.0', 'code': 50, 'msg': status_error})}'; exit 1"
        if status_error
        else "exit 0"
    )
    delete = (
        'echo \'{"cniVersion":"1.1.0","code":11,"msg":"DEL broke"}\'; exit 1'
        if del_fails
        else f"touch {bin_dir}/deleted-$CNI_CONTAINERID"
    )
    script = f"""#!/bin/sh
cat >/dev/null
echo "$CNI_COMMAND" >> {log}
case "$CNI_COMMAND" in
  STATUS) {status} ;;
  DEL) {delete} ;;
esac
exit 0
"""
    path = bin_dir / name
    path.write_text(script)
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return path


def plugin_config(plugin: str = "fakeplugin", *, name: str = "mynet", version: str = "1.1.0") -> bytes:
    return json.dumps({"cniVersion": version, "name": name, "plugins": [{"type": plugin}]}).encode()


def verbs_run(bin_dir: Path, name: str = "fakeplugin") -> list[str]:
    log = bin_dir / f"{name}.log"
    return log.read_text().split() if log.exists() else []


def request_for(attachment: Attachment, config: bytes) -> DelRequest:
    """The DEL request the reclaim path builds for a fake attachment of network mynet."""
    return DelRequest(
        container_id=str(attachment.key.container_id),
        network="mynet",
        ifname="eth0",
        netns="/proc/self/ns/net",
        config=config,
        source="/test/conf",
    )
