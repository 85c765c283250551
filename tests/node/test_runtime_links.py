"""A known socket path followed only through what root alone could have made (issue 31 case 4):
a link or a directory on the way that a user owns or may write, and a socket a user bound,
are a runtime that could not be asked, never asked and never "no socket". The user is a real
process as uid 65534 (setpriv) where it can act itself; root chowns what it could not make."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from reaper.model import RuntimeView
from reaper.runtime.cri import CriLiveness
from reaper.runtime.discovery import discover
from tests.harness.fake_cri import FakeRuntime, decoy_runtime, sandbox, sandbox_list

NOBODY = 65534
AS_NOBODY = ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups"]
PINNED = sandbox_list([sandbox("pinned", ready=False)])


@pytest.fixture
def decoy(tmp_path: Path) -> Iterator[Path]:
    """A runtime that answers and lists nothing, at a known path of its own."""
    with decoy_runtime(tmp_path) as path:
        yield path


def _through_a_dir_nobody_owns(at: Path, real: Path) -> None:
    """The admin linked the known path into a directory uid 65534 owns: that user could swap
    the socket there for one of its own at any time."""
    shared = at.parent / "shared"
    shared.mkdir()
    os.chown(shared, NOBODY, NOBODY)
    os.link(real, shared / "runtime.sock")
    at.symlink_to(shared / "runtime.sock")


def _a_link_nobody_made_in_a_sticky_dir(at: Path, real: Path) -> None:
    """The known path's directory is sticky and world-writable (as /tmp): uid 65534 made the
    link there itself, to the real runtime's socket."""
    at.parent.chmod(0o1777)
    subprocess.run([*AS_NOBODY, "ln", "-s", str(real), str(at)], check=True)
    assert at.lstat().st_uid == NOBODY


def _through_a_dir_anyone_may_write(at: Path, real: Path) -> None:
    open_dir = at.parent / "open"
    open_dir.mkdir()
    open_dir.chmod(0o777)
    os.link(real, open_dir / "runtime.sock")
    at.symlink_to(open_dir / "runtime.sock")


def _a_socket_nobody_owns(at: Path, real: Path) -> None:
    os.link(real, at)
    os.chown(at, NOBODY, NOBODY)


HOSTILE: dict[str, tuple[Callable[[Path, Path], None], str]] = {
    "a symlink through a dir uid 65534 owns": (_through_a_dir_nobody_owns, "shared is owned by uid 65534, not root"),
    "a symlink uid 65534 made": (_a_link_nobody_made_in_a_sticky_dir, "crio.sock is owned by uid 65534, not root"),
    "a symlink through a dir anyone may write": (_through_a_dir_anyone_may_write, "may be written by others than root"),
    "a socket owned by uid 65534": (_a_socket_nobody_owns, "crio.sock is owned by uid 65534, not root"),
}


@pytest.fixture
def open_to_nobody() -> Iterator[Path]:
    """A private dir uid 65534 can reach (pytest's tmp_path is root's alone, 0700 on the way)."""
    base = Path(tempfile.mkdtemp(prefix="reaper-links-"))
    base.chmod(0o755)
    try:
        yield base
    finally:
        shutil.rmtree(base)


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_a_known_path_a_user_could_swap_is_never_asked_and_the_pass_waits(
    case: str, tmp_path: Path, decoy: Path, open_to_nobody: Path
) -> None:
    make, why = HOSTILE[case]
    (open_to_nobody / "crio").mkdir()
    at = open_to_nobody / "crio" / "crio.sock"
    real = tmp_path / "real.sock"
    with FakeRuntime(real, PINNED, {"pinned": "/run/netns/cni-pinned"}) as runtime:
        make(at, real)
        known = (("containerd", str(decoy)), ("cri-o", str(at)))
        view: RuntimeView = CriLiveness((), 5.0, find=lambda: discover(str(tmp_path / "proc"), known=known)).observe({})
        assert runtime.calls["ListPodSandbox"] == 0
    assert not view.reachable and view.sandboxes == ()
    assert view.error is not None and view.error.startswith(f"unix://{at}: could not be asked: ")
    assert why in view.error and "--runtime-endpoint" in view.error
