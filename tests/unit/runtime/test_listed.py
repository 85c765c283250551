"""What proves a container ID was this node's (reaper.runtime.listed): a runtime of the node
listed it to this process, for that pod, and every runtime now answers without it."""

from __future__ import annotations

from msgspec.structs import replace

from reaper.model import Attachment, AttachmentKey, NsKey, RuntimeAnswer, RuntimeView, Sandbox
from reaper.runtime.listed import ListedHere
from tests.harness.snapshots import cid, sandbox

A, B = "unix:///run/containerd/containerd.sock", "unix:///run/crio/crio.sock"


def _answer(endpoint: str, reachable: bool = True) -> RuntimeAnswer:
    return RuntimeAnswer(
        endpoint=endpoint,
        source="--runtime-endpoint",
        name="r",
        version="1",
        reachable=reachable,
        error=None if reachable else "connection refused",
        sandboxes=0,
    )


def _view(*sandboxes: Sandbox, runtimes: tuple[str, ...] = (A, B), down: tuple[str, ...] = ()) -> RuntimeView:
    """What the runtimes `runtimes` said, those in `down` unanswered (and then nothing is listed)."""
    reachable = not down
    return RuntimeView(
        endpoint=", ".join(runtimes),
        name="r",
        version="1",
        reachable=reachable,
        error=None if reachable else "connection refused",
        sandboxes=sandboxes if reachable else (),
        runtimes=tuple(_answer(e, e not in down) for e in runtimes),
    )


def _on(endpoint: str, n: int) -> Sandbox:
    return replace(sandbox(n), runtime=endpoint)


def _leftover(n: int, pod: str | None = None) -> Attachment:
    """A cache entry of sandbox n's alone, naming its pod (default/pod-n) unless told otherwise."""
    return Attachment(
        key=AttachmentKey(cid(n), "k8s-pod-network", "eth0"),
        resources=(),
        netns=None,
        verdict="orphan",
        reason="",
        age_seconds=0.0,
        pod=pod if pod is not None else f"default/pod-{n}",
    )


def test_a_sandbox_listed_here_before_and_gone_from_every_runtime_is_proven_gone() -> None:
    listed = ListedHere()
    listed.remember(_view(_on(A, 1), _on(B, 2)))
    gone = listed.gone([_leftover(1), _leftover(2), _leftover(3)], _view())
    assert gone == {cid(1): ("default", "pod-1"), cid(2): ("default", "pod-2")}


def test_an_id_no_runtime_here_listed_proves_nothing() -> None:
    """A forged entry naming a container ID of another node's pod: never listed here."""
    listed = ListedHere()
    listed.remember(_view(_on(A, 1)))
    assert listed.gone([_leftover(7)], _view()) == {}
    # A one-shot, or an agent just started, has seen nothing at all.
    assert ListedHere().gone([_leftover(1)], _view()) == {}


def test_nothing_is_proven_while_any_runtime_is_unanswered_or_still_lists_it() -> None:
    listed = ListedHere()
    listed.remember(_view(_on(A, 1)))
    assert listed.gone([_leftover(1)], _view(down=(B,))) == {}
    assert listed.gone([_leftover(1)], _view(down=(A,))) == {}
    # Still listed (by either runtime): live.
    assert listed.gone([_leftover(1)], _view(_on(B, 1))) == {}
    # The runtime that listed it is no longer among those asked (its socket gone): unproven.
    assert listed.gone([_leftover(1)], _view(runtimes=(B,))) == {}
    # A view with no answer at all remembers nothing.
    late = ListedHere()
    late.remember(replace(_view(_on(A, 4)), reachable=False))
    assert late.gone([_leftover(4)], _view()) == {}


def test_the_entry_must_name_the_pod_its_runtime_listed_and_be_in_no_namespace() -> None:
    """Calico's IPAM DEL also releases a handle named after the pod CNI_ARGS name."""
    listed = ListedHere()
    listed.remember(_view(_on(A, 1)))
    assert listed.gone([_leftover(1, pod="kube-system/coredns-1")], _view()) == {}
    no_pod = replace(_leftover(1), pod=None)
    assert listed.gone([no_pod], _view()) == {}
    assert listed.gone([replace(_leftover(1), netns=NsKey(4, 9))], _view()) == {}


def test_memory_is_bounded_the_longest_unlisted_dropped_first() -> None:
    listed = ListedHere(limit=3)
    listed.remember(_view(_on(A, 1), _on(A, 2), _on(A, 3)))
    listed.remember(_view(_on(A, 1), _on(A, 4)))  # 1 listed again: 2 is now the oldest
    assert len(listed) == 3
    gone = listed.gone([_leftover(n) for n in (1, 2, 3, 4)], _view())
    assert set(gone) == {cid(1), cid(3), cid(4)}
