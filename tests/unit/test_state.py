"""The state file: one of any other shape is set aside with a warning, and the pass goes on."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from reaper.state import EMPTY_STATE, StateError, load_state, save_state


@pytest.mark.parametrize(
    "content",
    [
        json.dumps({"version": 2, "attachments": {"k": []}}),
        json.dumps({"version": 2, "attachments": []}),
        json.dumps({"version": 2, "attachments": {"k": ["x", 1]}}),
        json.dumps({"version": 2, "sandbox_netns": 7}),
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
