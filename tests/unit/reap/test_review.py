"""Plan files: written for review, read back as input anyone who can write the file could shape.
A plan only narrows a pass (tests/unit/reap/test_reap_pass.py drives that); here, every file
that is not one this node's reaper wrote since its last boot is one line of refusal."""

from __future__ import annotations

import json
import os
from pathlib import Path

import msgspec
import pytest
from msgspec.structs import replace

from reaper.model import Attachment, AttachmentKey, PlannedAttachment, PlannedStep
from reaper.reap.review import (
    FORMAT,
    MAX_PLAN_BYTES,
    NodeIdentity,
    PlanError,
    PlanFile,
    plan_document,
    plan_keys,
    read_plan,
    reviewed_orphans,
    steps_changed,
)
from tests.harness.reclaim_fakes import FakeNode

NODE = NodeIdentity("node-a", "boot-1")


def planned(node: FakeNode) -> tuple[list[PlannedAttachment], list[Attachment]]:
    one = node.attachment(1, node.add("res-1"), node.add("last-1"))
    steps = tuple(PlannedStep(r.kind, r.name, "kernel") for r in one.resources)
    return [PlannedAttachment(one.key, None, steps)], [one]


def written(tmp_path: Path) -> tuple[Path, dict[str, object]]:
    node = FakeNode()
    plan, attachments = planned(node)
    path = tmp_path / "plan.json"
    path.write_bytes(plan_document(plan, attachments, NODE, 123.0))
    doc: dict[str, object] = json.loads(path.read_text())
    return path, doc


def test_a_plan_reads_back_as_written(tmp_path: Path) -> None:
    path, doc = written(tmp_path)
    assert doc["format"] == FORMAT and doc["node"] == "node-a" and doc["made_at"] == 123.0
    plan = read_plan(str(path), NODE)
    (entry,) = plan.attachments
    assert entry.key.network == "mynet" and len(entry.resources) == 2
    assert [s.method for s in entry.steps] == ["kernel", "kernel"]
    assert path.read_bytes().endswith(b"\n")


HOSTILE: list[tuple[str, object, str]] = [
    ("not-json", b"{", "not JSON"),
    ("other-format", {"format": "cni-reaper-plan/9"}, "this reaper reads"),
    ("other-node", {"node": "node-b"}, "made on node 'node-b'"),
    ("other-boot", {"boot_id": "boot-0"}, "before this node's last boot"),
    ("unknown-field", {"force": True}, "not a plan"),
    ("wrong-type", {"attachments": "all"}, "not a plan"),
    ("long-name", {"node": "x" * 5000}, "not a plan"),
]


@pytest.mark.parametrize(("change", "says"), [(h[1], h[2]) for h in HOSTILE], ids=[h[0] for h in HOSTILE])
def test_a_file_this_node_did_not_write_is_refused_in_one_line(tmp_path: Path, change: object, says: str) -> None:
    path, doc = written(tmp_path)
    path.write_bytes(change if isinstance(change, bytes) else json.dumps({**doc, **change}).encode())  # type: ignore[dict-item]
    with pytest.raises(PlanError, match=says) as err:
        read_plan(str(path), NODE)
    assert "\n" not in str(err.value) and len(str(err.value)) < 600


def test_a_node_without_a_boot_id_reads_no_plan(tmp_path: Path) -> None:
    path, _ = written(tmp_path)
    with pytest.raises(PlanError, match="last boot"):
        read_plan(str(path), NodeIdentity("node-a", ""))


def test_only_a_bounded_regular_file_is_read(tmp_path: Path) -> None:
    path, _ = written(tmp_path)
    link = tmp_path / "link.json"
    link.symlink_to(path)
    with pytest.raises(PlanError, match=r"link\.json"):
        read_plan(str(link), NODE)
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    with pytest.raises(PlanError, match="not a regular file"):
        read_plan(str(fifo), NODE)  # opened without blocking, refused before any read
    big = tmp_path / "big.json"
    with open(big, "wb") as f:
        f.truncate(MAX_PLAN_BYTES + 1)
    with pytest.raises(PlanError, match="larger than"):
        read_plan(str(big), NODE)
    with pytest.raises(PlanError, match="No such file"):
        read_plan(str(tmp_path / "missing.json"), NODE)


def test_a_step_a_config_or_a_method_that_differs_is_named() -> None:
    node = FakeNode()
    plan_now, attachments = planned(node)
    path_doc = plan_document(plan_now, attachments, NODE, 0.0)
    reviewed = plan_keys(msgspec.json.decode(path_doc, type=PlanFile))
    (same,) = plan_now
    assert steps_changed(same, reviewed) is None
    by_del = replace(same, config_source="/etc/cni/net.d/10-net.conflist")
    assert "DEL would take its config from /etc/cni/net.d/10-net.conflist" in str(steps_changed(by_del, reviewed))
    other = replace(same, steps=(*same.steps[:1], replace(same.steps[1], method="quarantine")))
    assert steps_changed(other, reviewed) == "its steps or their methods differ from the plan's"
    stranger = replace(same, key=AttachmentKey("f" * 64, "mynet", "eth0"))
    assert steps_changed(stranger, reviewed) == "not in the reviewed plan"


def test_a_plan_naming_what_is_not_an_orphan_reclaims_nothing_of_it() -> None:
    """A forged plan that names a live attachment, with its very resources: still live."""
    node = FakeNode()
    alive = node.attachment(1, node.add("live-1"), verdict="live")
    plan_doc = plan_document([PlannedAttachment(alive.key, None, ())], [alive], NODE, 0.0)
    kept, skipped = reviewed_orphans([], [alive], msgspec.json.decode(plan_doc, type=PlanFile))
    assert kept == [] and [s.reason for s in skipped] == ["in the reviewed plan, but live now: test"]
