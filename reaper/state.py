"""The state file: what earlier passes saw, so a one-shot run counts confirmations too."""

from __future__ import annotations

import os
from collections.abc import Mapping

from msgspec import Struct

from reaper.host.atomic import write_atomically
from reaper.host.confined import UnfitFile, read_beneath
from reaper.host.files import describe_oserror
from reaper.host.jsondoc import dumps_compact, parse_json
from reaper.model import AttachmentHistory

STATE_VERSION = 2
MAX_STATE_BYTES = 64 << 20


class State(Struct, frozen=True):
    attachments: Mapping[str, AttachmentHistory]
    # Sandbox.status_key -> the netns path PodSandboxStatus gave, so it is asked once per sandbox.
    # Keys of files older than status keys hold no '@' and so match nothing.
    sandbox_netns: Mapping[str, str]
    # sandbox ID -> when first listed, for sandboxes whose runtime reports no creation time
    sandbox_first_seen: Mapping[str, float]


EMPTY_STATE = State({}, {}, {})


class StateError(Exception):
    pass


def load_state(path: str) -> tuple[State, str | None]:
    """The saved state, or an empty one and a warning when the file is missing or unusable.

    An unusable file only costs confirmations (they start again), never a wrong verdict.
    """
    try:
        raw, _ = read_beneath(os.path.dirname(path), path, MAX_STATE_BYTES)
    except FileNotFoundError:
        return EMPTY_STATE, None
    except OSError as err:
        return EMPTY_STATE, f"cannot read state file {path}: {describe_oserror(err)}; starting afresh"
    except UnfitFile as err:
        return EMPTY_STATE, f"state file {path} is unusable ({err}); {_set_aside(path)}; starting afresh"
    try:
        doc = parse_json(raw)
        if not isinstance(doc, dict) or doc.get("version") != STATE_VERSION:
            raise ValueError("unknown version")
        attachments = {str(k): AttachmentHistory(float(v[0]), int(v[1])) for k, v in doc.get("attachments", {}).items()}
        netns = {str(k): str(v) for k, v in doc.get("sandbox_netns", {}).items()}
        first_seen = {str(k): float(v) for k, v in doc.get("sandbox_first_seen", {}).items()}
    except (ValueError, TypeError, KeyError, AttributeError, IndexError) as err:  # any shape but ours
        return EMPTY_STATE, f"state file {path} is corrupt ({str(err)[:200]}); {_set_aside(path)}; starting afresh"
    return State(attachments, netns, first_seen), None


def _set_aside(path: str) -> str:
    """Keep an unusable state file for a look (the next save writes a new one)."""
    aside = f"{path}.corrupt"
    try:
        os.replace(path, aside)
    except OSError as err:
        return f"could not set it aside: {err.strerror}"
    return f"set aside as {aside}"


def save_state(path: str, state: State) -> None:
    """Write atomically: a temp file in the same dir, fsync, rename. Mode 0600."""
    doc = {
        "version": STATE_VERSION,
        # key -> [first_seen, orphan_streak]: compact, a node can have thousands.
        "attachments": {k: [v.first_seen, v.orphan_streak] for k, v in state.attachments.items()},
        "sandbox_netns": dict(sorted(state.sandbox_netns.items())),
        "sandbox_first_seen": dict(sorted(state.sandbox_first_seen.items())),
    }
    try:
        os.makedirs(os.path.dirname(os.path.abspath(path)), mode=0o700, exist_ok=True)
        write_atomically(path, dumps_compact(doc), 0o600)
    except OSError as err:
        raise StateError(f"cannot write state file {path}: {err.strerror}") from None
