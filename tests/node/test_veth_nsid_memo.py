"""The agent's memo of pin nsids on a real kernel: a pin unchanged since the last pass is not
asked again, and a namespace that died and was replaced at the same path, with the same inode
number (the kernel reuses it at once) and another nsid, is asked again, so every veth still
joins the namespace its peer is in. Pins that are no namespace (a FIFO, a symlink, a device, a
plain file) get no nsid and never block the pass."""

from __future__ import annotations

from tests.harness.probe import run_probe
from tests.harness.probes import veth_nsid_memo


def test_memo_answers_unchanged_pins_and_never_a_replaced_namespace() -> None:
    out = run_probe(veth_nsid_memo, "memo")
    # The dangerous case did happen: same path, same inode number, another namespace.
    assert out["a"] == out["a_before"], "the kernel did not reuse the inode number; the test proves nothing"
    assert out["first"] == {"ha": out["a_before"]}
    assert out["second"] == out["first"]
    assert out["third"] == {"ha2": out["a"], "hf": out["f"]}
    # Asked: every namespace pin once (never the FIFO, link, device, plain file or dir: they
    # are looked at and refused), then nothing, then the replaced pin and the new one.
    assert out["asked"][:2] == [["a"], ["a", "f"]]
    # Asked of everything in the dir, only the namespaces answer, and nothing blocks.
    assert out["asked"][2] == ["a", "dir", "f", "fifo", "link", "null", "plain"]
    assert out["answered"] == ["a", "f"]


def test_a_one_shot_ties_every_veth_to_the_pin_its_peer_is_in() -> None:
    """A look with no memo: every veth tied to the pinned namespace its peer is in, one whose
    peer is in a namespace pinned elsewhere to none (a symlink to that pin planted among the
    pins included), and only the namespace pins the netns kind found are asked."""
    out = run_probe(veth_nsid_memo, "one-shot")
    veths, errors = out["one_shot"]
    assert errors == []
    assert veths == {"ha": out["a"], "hb": out["b"], "hx": None}
    assert out["asked"] == [["a", "b"]]
