"""The state file: one of any other shape is set aside with a warning, and the pass goes on."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from reaper.model import AttachmentHistory
from reaper.state import (
    EMPTY_STATE,
    MAX_COUNTERS,
    MAX_ENTRIES,
    MAX_STATE_BYTES,
    MAX_STREAK,
    State,
    StateError,
    load_state,
    save_state,
)


@pytest.mark.parametrize(
    "content",
    [
        json.dumps({"version": 2, "attachments": {"k": []}}),
        json.dumps({"version": 2, "attachments": []}),
        json.dumps({"version": 2, "attachments": {"k": ["x", 1]}}),
        json.dumps({"version": 2, "sandbox_first_seen": 7}),
        json.dumps({"version": 99}),
        "[" * 100_000,
        "\xff not json",
    ],
)
def test_a_state_file_of_another_shape_starts_afresh(tmp_path: Path, content: str) -> None:
    path = tmp_path / "state.json"
    path.write_text(content, errors="surrogateescape")
    state, warning = load_state(str(path))
    assert state == EMPTY_STATE and warning is not None and "starting afresh" in warning
    aside = tmp_path / "state.json.corrupt"
    assert f"set aside as {aside}" in warning and not path.exists()
    assert aside.read_bytes() == content.encode(errors="surrogateescape"), "kept as it was, for a look"


def test_a_state_file_planted_as_a_symlink_is_neither_read_nor_written_through(tmp_path: Path) -> None:
    secret = tmp_path / "secret"
    secret.write_text(json.dumps({"version": 2, "attachments": {}}))
    path = tmp_path / "state.json"
    path.symlink_to(secret)
    state, warning = load_state(str(path))
    assert state == EMPTY_STATE and warning is not None and "symbolic link" in warning
    save_state(str(path), state)
    assert not path.is_symlink() and secret.read_text() == json.dumps({"version": 2, "attachments": {}})
    linked_dir = tmp_path / "linked"
    linked_dir.symlink_to(tmp_path)
    with pytest.raises(StateError, match="symlink"):
        save_state(str(linked_dir / "state.json"), state)


CID = "a" * 64
GOOD_PIN = "/var/run/netns/cni-0a1b2c3d-0000-4000-8000-000000000001"


def _doc(**maps: dict[str, object]) -> dict[str, object]:
    """A state file as a pass writes it, with `maps` in place of its maps."""
    doc: dict[str, object] = {
        "version": 2,
        "attachments": {f"{CID}/mynet/eth0": [1000.0, 1], f"netns:{GOOD_PIN}": [1000.0, 0]},
        "sandbox_first_seen": {CID: 1000.0},
        "counters": {'cni_reaper_passes_total{outcome="ok"}': 3.0},
    }
    doc.update(maps)
    return doc


HOSTILE: dict[str, str] = {
    "an attachment key that is a path": json.dumps(_doc(attachments={"../../etc/passwd": [1.0, 1]})),
    "an attachment key with a NUL": json.dumps(_doc(attachments={f"netns:{GOOD_PIN}\0x": [1.0, 1]})),
    "a pin key that is relative": json.dumps(_doc(attachments={"netns:run/netns/x": [1.0, 1]})),
    "a pin key not normalized": json.dumps(_doc(attachments={"netns:/run/netns/../../etc/x": [1.0, 1]})),
    "an ID no CNI rule allows": json.dumps(_doc(attachments={"-x/mynet/eth0": [1.0, 1]})),
    "an ifname too long": json.dumps(_doc(attachments={f"{CID}/mynet/{'e' * 16}": [1.0, 1]})),
    "a negative count": json.dumps(_doc(attachments={f"{CID}/mynet/eth0": [1.0, -1]})),
    "a count past the bound": json.dumps(_doc(attachments={f"{CID}/mynet/eth0": [1.0, 2**40]})),
    "a count that is true": json.dumps(_doc(attachments={f"{CID}/mynet/eth0": [1.0, True]})),
    "a count that is a fraction": json.dumps(_doc(attachments={f"{CID}/mynet/eth0": [1.0, 1.5]})),
    "a time before the epoch": json.dumps(_doc(attachments={f"{CID}/mynet/eth0": [-5.0, 1]})),
    "an infinite time": json.dumps(_doc(attachments={f"{CID}/mynet/eth0": [1.0, 1]})).replace("[1.0,", "[1e999,"),
    "a third field": json.dumps(_doc(attachments={f"{CID}/mynet/eth0": [1.0, 1, 1]})),
    "a first-seen ID that is a path": json.dumps(_doc(sandbox_first_seen={"x/y": 1.0})),
    "a first-seen time that is text": json.dumps(_doc(sandbox_first_seen={CID: "now"})),
    "a key more": json.dumps({**_doc(), "extra": 1}),
    "a counter of another program": json.dumps(_doc(counters={"node_cpu_seconds_total": 1.0})),
    "a counter label that breaks out": json.dumps(_doc(counters={'cni_reaper_x_total{a="b"} 9\nevil 1': 1.0})),
    "a negative counter": json.dumps(_doc(counters={"cni_reaper_passes_total": -1.0})),
    "a counter past 2^53": json.dumps(_doc(counters={"cni_reaper_passes_total": 2.0**60})),
    "a counter that is text": json.dumps(_doc(counters={"cni_reaper_passes_total": "many"})),
    "more counters than the cap": json.dumps(
        _doc(counters={f'cni_reaper_x_total{{n="{n}"}}': 1.0 for n in range(MAX_COUNTERS + 1)})
    ),
    "more entries than the cap": json.dumps(
        _doc(attachments={f"{CID}/net{n}/eth0": [1.0, 1] for n in range(MAX_ENTRIES + 1)})
    ),
}


@pytest.mark.parametrize("why", sorted(HOSTILE))
def test_a_state_file_with_any_entry_no_pass_writes_is_set_aside_whole(tmp_path: Path, why: str) -> None:
    """Whoever writes the state dir plants one bad entry among good ones: the whole file is set
    aside with a warning (the good ones are no better vouched for), and confirmations start over."""
    path = tmp_path / "state.json"
    path.write_text(HOSTILE[why])
    state, warning = load_state(str(path))
    assert state == EMPTY_STATE, why
    assert warning is not None and "is corrupt" in warning and "starting afresh" in warning, why
    assert (tmp_path / "state.json.corrupt").read_text() == HOSTILE[why] and not path.exists()


def test_a_state_file_a_pass_writes_is_read_back_whole(tmp_path: Path) -> None:
    path = tmp_path / "state.json"
    path.write_text(json.dumps(_doc()))
    state, warning = load_state(str(path))
    assert warning is None
    assert state.attachments == {
        f"{CID}/mynet/eth0": AttachmentHistory(1000.0, 1),
        f"netns:{GOOD_PIN}": AttachmentHistory(1000.0, 0),
    }
    assert state.sandbox_first_seen == {CID: 1000.0}
    assert state.counters == {'cni_reaper_passes_total{outcome="ok"}': 3.0}
    save_state(str(path), state)
    assert load_state(str(path)) == (state, None)


def test_the_reaper_never_writes_an_entry_its_reader_would_refuse(tmp_path: Path) -> None:
    """A runtime's sandbox ID no CNI rule allows, a count past the bound: left out, so the
    reaper never sets its own file aside (every pass would then start confirmations over, and
    nothing would ever be reclaimed)."""
    path = tmp_path / "state.json"
    odd = State(
        {f"{CID}/mynet/eth0": AttachmentHistory(1000.0, 2**40), "x/../y/z": AttachmentHistory(1.0, 1)},
        {CID: 5.0, "-bad": 5.0},
    )
    save_state(str(path), odd)
    state, warning = load_state(str(path))
    assert warning is None
    assert state == State({f"{CID}/mynet/eth0": AttachmentHistory(1000.0, MAX_STREAK)}, {CID: 5.0})


def test_a_state_file_past_the_size_cap_is_set_aside_unread(tmp_path: Path) -> None:
    path = tmp_path / "state.json"
    with open(path, "wb") as f:
        f.truncate(MAX_STATE_BYTES + 1)  # sparse: no disk
    state, warning = load_state(str(path))
    assert state == EMPTY_STATE and warning is not None and "starting afresh" in warning
    assert (tmp_path / "state.json.corrupt").exists() and not path.exists()


@pytest.mark.parametrize(
    "netns",
    [
        {f"{CID}@1700000000000000000": GOOD_PIN},  # as older versions wrote it
        {f"{CID}@1": "run/netns/x", "../x@1": "/run/netns/./x\0"},  # what no runtime gives
        7,
    ],
)
def test_an_older_files_sandbox_netns_is_taken_and_never_used_or_written(tmp_path: Path, netns: object) -> None:
    """A sandbox's netns is its runtime's answer in every run: the `sandbox_netns` map older
    versions kept in the file loads (the counts beside it count) and is dropped whatever it
    holds, and no pass writes it again."""
    path = tmp_path / "state.json"
    path.write_text(json.dumps({**_doc(), "sandbox_netns": netns}))
    state, warning = load_state(str(path))
    assert warning is None and state == load_state_of(tmp_path / "without.json", _doc())
    assert not hasattr(state, "sandbox_netns")
    save_state(str(path), state)
    assert "sandbox_netns" not in json.loads(path.read_text())


def load_state_of(path: Path, doc: dict[str, object]) -> State:
    path.write_text(json.dumps(doc))
    state, warning = load_state(str(path))
    assert warning is None
    return state


def test_a_directory_at_the_state_files_path_is_never_moved(tmp_path: Path) -> None:
    """Issue 35: `--state-file /var/lib/cni` (a dir) moved the whole dir to .corrupt."""
    path = tmp_path / "cni"
    (path / "networks").mkdir(parents=True)
    state, warning = load_state(str(path))
    assert state == EMPTY_STATE and warning is not None and "a directory, left where it is" in warning
    assert (path / "networks").is_dir() and not (tmp_path / "cni.corrupt").exists()
