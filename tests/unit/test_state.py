"""The state file: one of any other shape is set aside with a warning, and the pass goes on."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from reaper.state import EMPTY_STATE, load_state


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
