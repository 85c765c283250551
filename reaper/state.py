"""The state file: what earlier passes saw, so that a one-shot run counts confirmations too.

Whoever can write its dir must gain nothing: it is decoded into a fixed shape, capped, and each
entry checked by the rule its source obeys; one bad entry sets the whole file aside (only
confirmations are lost, never a verdict made wrong). A count from it never stands for more than
`confirmations - 1` passes (reaper.reconcile), and it holds no runtime's answer. The argument,
attacker by attacker: SECURITY.md, "The state file"; the versions: docs/design.md, "In depth:
the core, state and what is reported"."""

from __future__ import annotations

import math
import os
import re
import stat
from collections.abc import Mapping

import msgspec
from msgspec import Struct

from reaper.host.atomic import write_atomically
from reaper.host.confined import UnfitFile, read_beneath
from reaper.host.files import describe_oserror
from reaper.host.jsondoc import dumps_compact
from reaper.model import AttachmentHistory
from reaper.names import is_cni_id, is_ifname, is_path
from reaper.runtime.listed import ListedHere

STATE_VERSION = 3
OLDER_VERSION = 2  # attachments as [first_seen, orphan_streak]: read, never written
# 2,500 attachments are about 300 KB: the cap keeps a forged file small beside the memory limit.
MAX_STATE_BYTES = 8 << 20
MAX_ENTRIES = 50_000  # in each map
MAX_STREAK = 1 << 20  # consecutive passes: far more than any --confirmations
MAX_TIME = 1 << 40  # seconds since the epoch: beyond any real clock, finite
MAX_COUNTERS = 4096  # textfile counter samples: every kind, method, outcome, capped network and bucket
MAX_COUNT = float(1 << 53)  # a counter past this no longer counts by ones in a float
# A sample of one of the reaper's own counters, as prometheus_client names it with its labels.
_LABEL = r'[a-z_]{1,40}="[^"\\\n]{0,253}"'
_COUNTER_SAMPLE = re.compile(rf"cni_reaper_[a-z_]{{1,80}}(?:\{{{_LABEL}(?:,{_LABEL}){{0,4}}\}})?")


class State(Struct, frozen=True):
    attachments: Mapping[str, AttachmentHistory]
    # sandbox ID -> when first listed, for sandboxes whose runtime reports no creation time
    sandbox_first_seen: Mapping[str, float]
    # A one-shot's textfile counters so far, by sample (`name{labels}`), summed run to run.
    counters: Mapping[str, float] = {}


EMPTY_STATE = State({}, {})


class StateError(Exception):
    pass


class KeptState:
    """What the agent's last pass saved, in memory: its next pass counts from this, not from the
    file others may have rewritten; only its first pass reads the file."""

    def __init__(self) -> None:
        self.state: State | None = None
        # Sandbox.status_key -> the netns path PodSandboxStatus gave: asked once per sandbox.
        self.sandbox_netns: Mapping[str, str] = {}
        # What the runtimes listed to this process (reaper.runtime.listed); never in the file.
        self.listed = ListedHere()


class _Shared(Struct, forbid_unknown_fields=True):
    """The file but its attachments: the sandboxes' first-seen times, the textfile's counters;
    `sandbox_netns` (older versions' runtime answers) is taken, never read."""

    version: int
    sandbox_netns: msgspec.Raw = msgspec.Raw()
    sandbox_first_seen: dict[str, float] = {}
    counters: dict[str, float] = {}


class _Doc(_Shared):
    attachments: dict[str, tuple[float, int, float]] = {}  # [first_seen, orphan_streak, last counted (0: none)]


class _OlderDoc(_Shared):
    attachments: dict[str, tuple[float, int]] = {}  # version 2's: [first_seen, orphan_streak]


class _Version(Struct):
    version: int


def _decode(raw: bytes) -> _Doc:
    """The file in this version's shape (a version 2 file's counts never counted, time 0)."""
    version = msgspec.json.decode(raw, type=_Version).version
    if version != OLDER_VERSION:
        return msgspec.json.decode(raw, type=_Doc)
    older = msgspec.json.decode(raw, type=_OlderDoc)
    return _Doc(
        version=STATE_VERSION,
        attachments={k: (first_seen, streak, 0.0) for k, (first_seen, streak) in older.attachments.items()},
        sandbox_first_seen=older.sandbox_first_seen,
        counters=older.counters,
    )


def is_netns_path(path: str) -> bool:
    """An absolute, normalized path with no NUL that the kernel could take."""
    return path.startswith("/") and is_path(path) and os.path.normpath(path) == path


def is_attachment_key(key: str) -> bool:
    """AttachmentKey.as_text(): `netns:<pin path>`, or `<container ID>/<network>/<ifname>`
    with network and ifname each a CNI name or empty."""
    if key.startswith("netns:"):
        return is_netns_path(key[6:])
    parts = key.split("/")
    if len(parts) != 3:
        return False
    cid, network, ifname = parts
    return is_cni_id(cid) and (network == "" or is_cni_id(network)) and (ifname == "" or is_ifname(ifname))


def _is_time(value: float) -> bool:
    return math.isfinite(value) and 0 <= value <= MAX_TIME


def _history_fits(key: str, first_seen: float, streak: int, counted_at: float = 0.0) -> bool:
    return is_attachment_key(key) and _is_time(first_seen) and 0 <= streak <= MAX_STREAK and _is_time(counted_at)


def counter_fits(key: str, value: float) -> bool:
    """A sample key the metrics write, and a count they could reach."""
    return len(key) <= 1024 and _COUNTER_SAMPLE.fullmatch(key) is not None and 0 <= value <= MAX_COUNT


def _why_refused(doc: _Doc) -> str | None:
    """The first rule the decoded file breaks, or None."""
    if doc.version != STATE_VERSION:
        return f"version {doc.version}, not {STATE_VERSION}"
    for name, entries in (("attachments", doc.attachments), ("sandbox_first_seen", doc.sandbox_first_seen)):
        if len(entries) > MAX_ENTRIES:
            return f"{len(entries)} {name}, over {MAX_ENTRIES}"
    for key, (first_seen, streak, counted_at) in doc.attachments.items():
        if not _history_fits(key, first_seen, streak, counted_at):
            return f"attachment {key[:120]!r}: a key, time or count no pass writes"
    for key, when in doc.sandbox_first_seen.items():
        if not (is_cni_id(key) and _is_time(when)):
            return f"sandbox first seen {key[:120]!r}: an ID or time no pass writes"
    if len(doc.counters) > MAX_COUNTERS:
        return f"{len(doc.counters)} counters, over {MAX_COUNTERS}"
    for key, value in doc.counters.items():
        if not counter_fits(key, value):
            return f"counter {key[:120]!r}: a sample or count the metrics do not write"
    return None


def load_state(path: str) -> tuple[State, str | None]:
    """The saved state, or an empty one and a warning when the file is missing or unusable
    (which costs confirmations, never a wrong verdict)."""
    try:
        raw, _ = read_beneath(os.path.dirname(path), path, MAX_STATE_BYTES)
    except FileNotFoundError:
        return EMPTY_STATE, None
    except OSError as err:
        return EMPTY_STATE, f"cannot read state file {path}: {describe_oserror(err)}; starting afresh"
    except UnfitFile as err:
        return EMPTY_STATE, f"state file {path} is unusable ({err}); {_set_aside(path)}; starting afresh"
    try:
        doc = _decode(raw)
        why = _why_refused(doc)
    except (msgspec.DecodeError, msgspec.ValidationError, RecursionError) as err:  # any shape but ours
        why = str(err).splitlines()[0][:200] if str(err) else type(err).__name__
    if why is not None:
        return EMPTY_STATE, f"state file {path} is corrupt ({why}); {_set_aside(path)}; starting afresh"
    attachments = {
        k: AttachmentHistory(float(first_seen), streak, float(counted_at) if counted_at else None)
        for k, (first_seen, streak, counted_at) in doc.attachments.items()
    }
    first_seen = {k: float(v) for k, v in doc.sandbox_first_seen.items()}
    return State(attachments, first_seen, dict(doc.counters)), None


def _set_aside(path: str) -> str:
    """Keep an unusable state file for a look. A directory is never moved: it is a mistyped
    --state-file (/var/lib/cni), and moving it would take what it holds from its owner."""
    aside = f"{path}.corrupt"
    try:
        if stat.S_ISDIR(os.lstat(path).st_mode):
            return "a directory, left where it is"
        os.replace(path, aside)
    except OSError as err:
        return f"could not set it aside: {err.strerror}"
    return f"set aside as {aside}"


def _counted_at(history: AttachmentHistory) -> float:
    """When the count last rose, as written: 0 for none or for a time no reader would take."""
    when = history.counted_at
    return when if when is not None and _is_time(when) else 0.0


def save_state(path: str, state: State) -> None:
    """Write atomically (temp file, fsync, rename), mode 0600, only entries load_state takes
    (the first MAX_ENTRIES in key order): the reaper never sets aside its own file."""
    attachments = sorted(
        (k, [v.first_seen, min(v.orphan_streak, MAX_STREAK), _counted_at(v)])
        for k, v in state.attachments.items()
        if _history_fits(k, v.first_seen, 0) and v.orphan_streak >= 0
    )
    first_seen = sorted((k, v) for k, v in state.sandbox_first_seen.items() if is_cni_id(k) and _is_time(v))
    counters = sorted((k, v) for k, v in state.counters.items() if counter_fits(k, v))
    doc = {
        "version": STATE_VERSION,
        "attachments": dict(attachments[:MAX_ENTRIES]),
        "sandbox_first_seen": dict(first_seen[:MAX_ENTRIES]),
        "counters": dict(counters[:MAX_COUNTERS]),
    }
    try:
        os.makedirs(os.path.dirname(os.path.abspath(path)), mode=0o700, exist_ok=True)
        write_atomically(path, dumps_compact(doc), 0o600)
    except OSError as err:
        raise StateError(f"cannot write state file {path}: {err.strerror}") from None
