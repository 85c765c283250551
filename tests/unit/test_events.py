"""Kubernetes Events from the agent, against the API server stand-in (real TLS, a bearer token,
the events.k8s.io/v1 paths): the agent's real pass (reap_pass over the fake node of
tests/harness/reclaim_fakes.py) posts what it did on its Node; repeats are counted into the
Event's series; and an API that refuses, hangs or is gone changes nothing in the pass and costs
it no wait."""

from __future__ import annotations

import contextlib
import logging
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from lightkube import Client
from msgspec.structs import replace

from reaper.agent import Agent
from reaper.events import (
    CONTROLLER,
    MAX_NOTE,
    QUEUE_PASSES,
    EventPoster,
    events_from,
    pass_events,
)
from reaper.kubeapi import API_TIMEOUT, service_account
from reaper.kubeclient import api_client
from reaper.model import Attachment, IpamRange, ReclaimOutcome, ResourceOutcome, StuckSandbox
from reaper.reap import run
from reaper.settings import AgentSettings, agent_settings_from, resolve
from tests.harness.apiserver import EVENTS, TOKEN, ApiServer, api_server
from tests.harness.drip_apiserver import drip_server
from tests.harness.reclaim_fakes import (
    FAKE,
    FAKE_LAST,
    FakeLiveness,
    FakeNode,
    fake_settings,
    reap_settings,
    report_of,
    scan_result,
)
from tests.harness.results import reap_result
from tests.harness.snapshots import cid, runtime

NODE = "worker-3.example"
LOG = "test.events"
# The poster's deadline where the API holds its calls (hangs, drips): a held call must still be
# under way after a pass or two (0.03 s each here, 3 s seen once on a loaded machine), and each
# such case lasts about this long, for the call to end at it.
HELD_CALL_TIMEOUT = 10.0


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture(scope="module")
def api(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ApiServer]:
    with api_server(tmp_path_factory.mktemp("api")) as server:
        yield server


@pytest.fixture(autouse=True)
def fresh(api: ApiServer) -> Iterator[None]:
    api.writes.clear()
    api.events.clear()
    api.refuse_events = None
    yield
    if api.hang is not None:
        api.hang.set()
        api.hang = None


@pytest.fixture
def node(monkeypatch: pytest.MonkeyPatch) -> FakeNode:
    """A fake node: the only kinds the reclaim path knows, and every look of the pass is of it."""
    fake = FakeNode()
    monkeypatch.setattr(run, "take_snapshot", lambda *_a, **_k: fake.look())
    return fake


def scanned(monkeypatch: pytest.MonkeyPatch, node: FakeNode, *attachments: Attachment, **more: Any) -> None:
    """Each later pass's scan reports `attachments` (and `more` of the report)."""
    report = report_of(runtime(), *attachments, **more)
    monkeypatch.setattr(run, "scan_pass", lambda *_a, **_k: scan_result(report, node.look()))


def orphan(node: FakeNode, n: int, pod: tuple[str, str] | None = None) -> Attachment:
    """Attachment n, ownerless, of `pod` (as its cache entry's CNI_ARGS would name it)."""
    attachment = node.attachment(n, node.add(f"res-{n}"), node.add(f"last-{n}", FAKE_LAST))
    return attachment if pod is None else replace(attachment, pod=f"{pod[0]}/{pod[1]}")


def live(node: FakeNode, *ns: int) -> list[Attachment]:
    return [node.attachment(n, node.add(f"live-{n}"), verdict="live") for n in ns]


def poster(
    api: ApiServer,
    clock: Clock,
    *,
    window: float = 600.0,
    timeout: float = API_TIMEOUT,
    env: dict[str, str] | None = None,
) -> EventPoster:
    """A poster whose calls each have `timeout` for the whole call (the agent's own by default:
    a shared CI machine can take more than 2 s for a handshake and a POST)."""
    environ = {**api.env(), **(env or {})}
    return EventPoster(
        NODE,
        lambda: api_client(service_account(environ), timeout=timeout),
        logging.getLogger(LOG),
        clock=clock,
        window=window,
        where=f"{environ['KUBERNETES_SERVICE_HOST']}:{environ['KUBERNETES_SERVICE_PORT']}",
    )


def make_agent(node: FakeNode, tmp_path: Path, clock: Clock, events: EventPoster | None, **reap: Any) -> Agent:
    settings = AgentSettings(
        mode="reap", interval=60.0, listen_host="127.0.0.1", listen_port=0, stall_after=600.0, events=True
    )
    return Agent(
        fake_settings(tmp_path),
        reap_settings(**reap),
        settings,
        FakeLiveness(runtime()),
        logging.getLogger(LOG),
        clock,
        events=events,
        registry=node.registry,
    )


# ----------------------------------------------------------------------------- what is posted


def test_a_reclaiming_pass_posts_leaks_reclaimed_on_the_node(
    api: ApiServer, node: FakeNode, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    scanned(monkeypatch, node, orphan(node, 1, ("shop", "web-7f9c")), orphan(node, 2), *live(node, 3, 4, 5, 6))
    clock = Clock()
    events = poster(api, clock)
    agent = make_agent(node, tmp_path, clock, events)
    agent.run_pass()
    assert api.wait_for_writes(1)
    events.close()
    ((method, path, content_type, body),) = api.writes
    assert (method, path, content_type) == ("POST", EVENTS, "application/json")
    assert body["apiVersion"] == "events.k8s.io/v1" and body["kind"] == "Event"
    assert body["reason"] == "LeaksReclaimed" and body["type"] == "Normal" and body["action"] == "Reclaim"
    assert body["regarding"] == {"apiVersion": "v1", "kind": "Node", "name": NODE, "uid": NODE}
    assert body["reportingController"] == CONTROLLER and body["reportingInstance"] == NODE
    meta = body["metadata"]
    assert isinstance(meta, dict) and meta["namespace"] == "default" and str(meta["name"]).startswith(f"{NODE}.")
    assert body["note"] == "reclaimed 2 leaked attachments (2 fake, 2 fakelast) of pods shop/web-7f9c"
    # The pass's time by the agent's clock, as a MicroTime: six fractional digits, or the API refuses it.
    assert body["eventTime"] == "1970-01-12T13:46:40.000001Z"
    assert {r.name for r in node.records.values()} == {f"live-{n}" for n in (3, 4, 5, 6)}


def test_a_breaker_pass_posts_breaker_open(
    api: ApiServer, node: FakeNode, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    scanned(monkeypatch, node, orphan(node, 1), orphan(node, 2), orphan(node, 3), *live(node, 4))
    clock = Clock()
    events = poster(api, clock)
    make_agent(node, tmp_path, clock, events, max_orphan_ratio=0.5).run_pass()
    assert api.wait_for_writes(1)
    events.close()
    (body,) = api.posted()
    assert (body["reason"], body["type"], body["action"]) == ("BreakerOpen", "Warning", "Refuse")
    assert str(body["note"]).startswith("breaker open, nothing reclaimed: 3 of 4")
    assert len(node.records) == 7  # nothing reclaimed


def test_a_nearly_full_range_and_stuck_sandboxes_are_warnings(
    api: ApiServer, node: FakeNode, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    stuck = StuckSandbox(id=cid(9), name="stuck-pod", namespace="kube-system", age_seconds=7260.0, resources=())
    ranges = (IpamRange("mynet", "10.244.3.0/24", 253, 240), IpamRange("roomy", "10.9.0.0/24", 253, 12))
    scanned(monkeypatch, node, *live(node, 1), ranges=ranges, stuck_sandboxes=(stuck,))
    clock = Clock()
    events = poster(api, clock)
    make_agent(node, tmp_path, clock, events).run_pass()
    assert api.wait_for_writes(2)
    events.close()
    full, sandboxes = api.posted()
    assert (full["reason"], full["type"], full["action"]) == ("IPRangeNearlyFull", "Warning", "Observe")
    assert full["note"] == (
        "host-local range 10.244.3.0/24 of network mynet is nearly full: 240 of 253 addresses leased (94%)"
    )
    assert (sandboxes["reason"], sandboxes["type"]) == ("SandboxStuck", "Warning")
    assert "kube-system/stuck-pod (000000000000, NOTREADY 2h01m)" in str(sandboxes["note"])


def test_a_repeat_is_counted_into_the_series_not_posted_again(
    api: ApiServer, node: FakeNode, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    scanned(monkeypatch, node, orphan(node, 1), orphan(node, 2), *live(node, 3))
    clock = Clock()
    events = poster(api, clock, window=100.0)
    agent = make_agent(node, tmp_path, clock, events, max_orphan_ratio=0.5)
    for now in (0.0, 60.0, 120.0, 400.0):  # the third is a window after the post; the fourth, past the key's
        clock.now = 1_000_000.0 + now
        agent.run_pass()
    assert api.wait_for_writes(3)
    events.close()
    assert [(method, body.get("reason")) for method, _, _, body in api.writes] == [
        ("POST", "BreakerOpen"),
        ("PATCH", None),
        ("POST", "BreakerOpen"),
    ]
    _, path, content_type, patch = api.writes[1]
    first = api.posted()[0]["metadata"]
    assert isinstance(first, dict) and path == f"{EVENTS}/{first['name']}"
    assert content_type == "application/merge-patch+json"
    assert patch == {"series": {"count": 3, "lastObservedTime": "1970-01-12T13:48:40.000000Z"}}


def test_a_pass_sends_at_most_a_few_events_and_notes_fit_the_api() -> None:
    ranges = tuple(IpamRange(f"net{n}", f"10.{n}.0.0/24", 253, 250) for n in range(20))
    stuck = tuple(
        StuckSandbox(id=cid(n), name="p" * 200, namespace="ns", age_seconds=3600.0, resources=()) for n in range(20)
    )
    report = report_of(runtime(), ranges=ranges, stuck_sandboxes=stuck)
    result = reap_result(report=report, breaker_open=True, breaker_reason="9 of 10", reclaimed=(), skipped=())
    events = pass_events(result)
    assert [e.reason for e in events] == ["BreakerOpen", "IPRangeNearlyFull", "IPRangeNearlyFull", "IPRangeNearlyFull",
                                          "IPRangeNearlyFull"]  # fmt: skip
    assert all(len(e.note) <= MAX_NOTE for e in pass_events(result, limit=100))


def test_pods_are_named_by_reclaimed_attachments_only(node: FakeNode) -> None:
    freed, kept, failed = orphan(node, 1, ("a", "one")), orphan(node, 2, ("b", "two")), orphan(node, 3, ("c", "x"))
    done = ResourceOutcome(kind=FAKE, name="res-1", method="kernel", ok=True, error=None)
    broke = ResourceOutcome(kind=FAKE, name="res-3", method="kernel", ok=False, error="busy")
    reclaimed = (ReclaimOutcome(freed.key, (done,), ()), ReclaimOutcome(failed.key, (broke,), ()))
    result = reap_result(report=report_of(runtime(), freed, kept, failed), reclaimed=reclaimed)
    (event,) = pass_events(result)
    assert event.note == "reclaimed 1 leaked attachment (1 fake) of pods a/one"
    assert pass_events(replace(result, reclaimed=reclaimed[1:])) == ()  # nothing freed: no Event


# ----------------------------------------------------------------------------- an API that fails


def leak_beside_live(node: FakeNode, monkeypatch: pytest.MonkeyPatch) -> None:
    """The node anew: one leak of pod shop/web beside two live attachments."""
    node.records.clear()
    scanned(monkeypatch, node, orphan(node, 1, ("shop", "web")), *live(node, 2, 3))


def counted(agent: Agent) -> str:
    """The agent's metrics but those of time (durations, timestamps)."""
    text = agent.metrics.exposition().decode()
    return "\n".join(line for line in text.splitlines() if "seconds" not in line and "_created" not in line)


@pytest.mark.parametrize("failure", ["refuses", "hangs", "gone", "drips"])
def test_an_api_that_fails_changes_nothing_and_costs_one_log_line(
    api: ApiServer,
    node: FakeNode,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    failure: str,
) -> None:
    """Four passes while the API fails every Event write: each pass's outcome, log fields and
    metrics are those of the same pass with no Events, and the failure costs one log line.

    That a pass never waits for the API is shown where the API holds the call (hangs, drips):
    the first pass's call is seen held at the API after that pass returned, and it has still not
    ended after the second pass, whose Events are submitted while it is held. A pass that waited
    for the call would have returned only once it ended (at the poster's deadline). Where the
    call ends at once (refuses, gone), a pass that made it inline would look the same: those
    cases show the outcome and the one line, not that the pass does not wait."""
    plain = make_agent(node, tmp_path / "plain", Clock(), None)  # the same passes with no Events at all
    wants = []
    for _ in range(4):  # made first, so that nothing but the agent's passes runs while a call is held
        leak_beside_live(node, monkeypatch)
        wants.append((plain._pass(), counted(plain)))
    stack = contextlib.ExitStack()
    env: dict[str, str] = {}
    held = failure in ("hangs", "drips")
    if failure == "refuses":
        api.refuse_events = 403
    elif failure == "hangs":
        api.hang = threading.Event()
    elif failure == "drips":  # a byte every 0.2 s: every read is in time, the call is not
        (tmp_path / "drip").mkdir()
        dripping = stack.enter_context(drip_server(tmp_path / "drip"))
        env.update(dripping.env())
    else:
        listener = socket.socket()
        listener.bind(("127.0.0.1", 0))
        env["KUBERNETES_SERVICE_PORT"] = str(listener.getsockname()[1])
        listener.close()  # nothing listens there now

    def first_call_held() -> bool:
        """The call the first pass began has not ended: no call has failed yet (a failed one sets
        `failing`, and none can succeed), and the API still holds that call."""
        if events.failing is not None:
            return False
        return len(api.writes) == 1 if failure == "hangs" else not dripping.closed.is_set()

    clock = Clock()
    events = poster(api, clock, timeout=HELD_CALL_TIMEOUT, env=env)
    agent = make_agent(node, tmp_path, clock, events)
    caplog.set_level(logging.INFO, logger=LOG)
    for n, want in enumerate(wants):
        clock.now += 60.0 * n
        leak_beside_live(node, monkeypatch)
        assert (agent._pass(), counted(agent)) == want  # outcome, log fields, metrics: as with no Events
        if held and n == 0:  # the first pass's Event write is at the API: received, or answered a byte
            assert api.wait_for_writes(1) if failure == "hangs" else dripping.wait_for_sent(1)
        if held and n < 2:
            assert first_call_held(), f"pass {n + 1} returned only once the call it could wait for had ended"
    deadline = time.monotonic() + HELD_CALL_TIMEOUT + 20  # a held call ends at the poster's deadline
    while events.failing is None and time.monotonic() < deadline:
        time.sleep(0.05)
    if failure == "drips":
        assert dripping.sent >= 3 and dripping.closed.wait(10), "dripped within each read's timeout, then cut off"
    stack.close()  # the API lets go of what it holds: the poster's next call ends at once
    if api.hang is not None:
        api.hang.set()
    events.close()
    warnings = [r for r in caplog.records if r.name == LOG and r.levelno >= logging.WARNING]
    assert [r.getMessage() for r in warnings] == ["events not posted; the passes go on without them"]
    error = str(warnings[0].__dict__["error"])
    deadline_passed = f"did not answer in time (the call's deadline of {HELD_CALL_TIMEOUT:g}s passed)"
    assert {
        "refuses": "HTTP 403 (Forbidden)",
        "hangs": deadline_passed,
        "gone": "did not answer",
        "drips": deadline_passed,
    }[failure] in error, error


def test_a_run_pass_with_a_hanging_api_returns_at_once(
    api: ApiServer, node: FakeNode, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The agent's whole pass (metrics, readiness) while the API holds every Event write until the
    test lets go: ten passes end while the call the first began is still held."""
    api.hang = threading.Event()
    scanned(monkeypatch, node, orphan(node, 1), *live(node, 2, 3))
    clock = Clock()
    # The test lets go of the call; the poster's deadline, which would end it too, is far beyond
    # ten passes on a loaded machine.
    events = poster(api, clock, timeout=120.0)
    agent = make_agent(node, tmp_path, clock, events)
    agent.run_pass()
    assert api.wait_for_writes(1)  # the first pass's Event is at the API, which holds it
    for _ in range(9):  # more passes than the queue holds: the newest are dropped
        agent.run_pass()
    # No call has ended (a failed one sets `failing`), and the poster is still in its first: had
    # a pass waited for it, that pass would have returned only after it ended.
    assert events.failing is None and len(api.writes) == 1, (events.failing, len(api.writes))
    assert agent.passes == 10 and agent.readiness() == (True, "ok")
    assert agent.metrics.registry.get_sample_value("cni_reaper_passes_total", {"outcome": "ok"}) == 10
    assert events.dropped == 9 - QUEUE_PASSES  # the poster holds the first pass's; the queue, the next ones
    api.hang.set()
    events.close()


# ----------------------------------------------------------------------------- settings


def test_events_are_on_by_default_and_off_by_flag_or_variable() -> None:
    from reaper.cli import build_parser  # noqa: PLC0415

    parser = build_parser()
    assert agent_settings_from(parser.parse_args(["run"]), {}).events is True
    assert agent_settings_from(parser.parse_args(["run", "--events", "off"]), {}).events is False
    assert agent_settings_from(parser.parse_args(["run"]), {"REAPER_EVENTS": "off"}).events is False
    assert agent_settings_from(parser.parse_args(["run", "--events=on"]), {"REAPER_EVENTS": "off"}).events is True
    with pytest.raises(ValueError, match="'maybe' is not on or off"):
        resolve(parser.parse_args(["run", "--events", "maybe"]), {})


def test_no_poster_outside_a_pod_or_without_a_node_name(api: ApiServer, caplog: pytest.LogCaptureFixture) -> None:
    log = logging.getLogger(LOG)
    caplog.set_level(logging.INFO, logger=LOG)
    assert events_from(False, NODE, api.env(), log) is None
    assert events_from(True, NODE, {}, log) is None
    assert events_from(True, None, api.env(), log) is None
    assert events_from(True, "../secrets", api.env(), log) is None
    assert [r.getMessage() for r in caplog.records] == [
        "events off: not in a pod (no KUBERNETES_SERVICE_HOST), so no API to post them to",
        "events off: no valid --node-name to post them on",
        "events off: no valid --node-name to post them on",
    ]
    assert api.writes == []
    made = events_from(True, NODE, api.env(), log)
    assert made is not None
    made.close()


def test_a_service_account_for_events_only_is_never_asked_for_the_node(api: ApiServer) -> None:
    from reaper.cli import build_parser  # noqa: PLC0415
    from reaper.settings import settings_from, with_pod_cidrs  # noqa: PLC0415

    api.seen.clear()
    args = build_parser().parse_args(["run", "--node-name", NODE, "--pod-cidr-from-node", "off"])
    settings = with_pod_cidrs(settings_from(args, {}), api.env())
    assert settings.node_name == NODE and settings.find.pod_cidrs is None and settings.layout_problems == ()
    assert api.seen == []


def test_a_hostile_pod_name_in_cni_args_is_not_reported(tmp_path: Path) -> None:
    import json  # noqa: PLC0415

    from reaper.kinds.cache import collect_cache  # noqa: PLC0415

    results = tmp_path / "results"
    results.mkdir()
    for n, (namespace, name) in enumerate([("shop", "web-1"), ("shop", "a\nb"), ("Shop", "web"), ("x" * 64, "y")]):
        doc = {
            "kind": "cniCacheV1",
            "containerId": cid(n),
            "ifName": "eth0",
            "networkName": "mynet",
            "cniArgs": [["K8S_POD_NAMESPACE", namespace], ["K8S_POD_NAME", name]],
            "result": {"cniVersion": "1.0.0"},
        }
        (results / f"mynet-{cid(n)}-eth0").write_text(json.dumps(doc))
    inventory = collect_cache(str(tmp_path), {"mynet"})
    pods = sorted(f"{e.pod_namespace}/{e.pod_name}" for e in inventory.entries)
    assert pods == ["None/None", "None/None", "None/None", "shop/web-1"]


def test_a_refused_token_is_read_again_once(api: ApiServer, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """The kubelet rotates the service-account token: a 401 makes a new client from the files."""
    sa = tmp_path / "sa"
    sa.mkdir()
    (sa / "ca.crt").write_bytes((api.sa_dir / "ca.crt").read_bytes())
    (sa / "token").write_text("stale-token")
    env = {**api.env(), "REAPER_SERVICEACCOUNT_DIR": str(sa)}
    connects: list[str] = []

    def connect() -> Client:
        account = service_account(env)
        connects.append(account.token)
        (sa / "token").write_text(TOKEN)  # rotated after the first read
        return api_client(account)

    caplog.set_level(logging.INFO, logger=LOG)
    events = EventPoster(NODE, connect, logging.getLogger(LOG), clock=Clock())
    events.submit(reap_result(report=report_of(runtime()), breaker_open=True, breaker_reason="3 of 4", reclaimed=()))
    assert api.wait_for_writes(2)
    events.close()
    assert connects == ["stale-token", TOKEN]
    assert [body["reason"] for body in api.events.values()] == ["BreakerOpen"]
    assert events.failing is None and not [r for r in caplog.records if r.getMessage().startswith("events")]


def test_a_series_whose_event_expired_starts_a_new_event(
    api: ApiServer, node: FakeNode, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    scanned(monkeypatch, node, orphan(node, 1), orphan(node, 2), *live(node, 3))
    clock = Clock()
    events = poster(api, clock, window=100.0)
    agent = make_agent(node, tmp_path, clock, events, max_orphan_ratio=0.5)
    caplog.set_level(logging.INFO, logger=LOG)
    agent.run_pass()
    deadline = time.monotonic() + 10
    while not api.events and time.monotonic() < deadline:  # stored once answered, after the write is seen
        time.sleep(0.01)
    api.events.clear()  # the API let it expire
    for now in (60.0, 120.0):
        clock.now = 1_000_000.0 + now
        agent.run_pass()
    assert api.wait_for_writes(3), (api.writes, events.failing)
    events.close()
    assert [method for method, *_ in api.writes] == ["POST", "PATCH", "POST"]
    assert [body["reason"] for body in api.events.values()] == ["BreakerOpen"]
    assert not [r for r in caplog.records if r.getMessage().startswith("events")]  # an expiry is no failure


def test_events_go_to_the_namespace_given(
    api: ApiServer, node: FakeNode, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """--events-namespace (the chart's events.namespace, where its Role is): the Event is posted
    there, not in `default`, where the service account may write nothing."""
    from reaper.cli import build_parser  # noqa: PLC0415

    parser = build_parser()
    assert agent_settings_from(parser.parse_args(["run"]), {}).events_namespace == "default"
    chosen = agent_settings_from(parser.parse_args(["run"]), {"REAPER_EVENTS_NAMESPACE": "cni-reaper"})
    assert chosen.events_namespace == "cni-reaper"
    with pytest.raises(ValueError, match="not a namespace name"):
        resolve(parser.parse_args(["run", "--events-namespace", "Kube_System"]), {})

    scanned(monkeypatch, node, orphan(node, 1), *live(node, 3, 4, 5))
    events = events_from(True, NODE, api.env(), logging.getLogger(LOG), namespace="cni-reaper")
    assert events is not None
    agent = make_agent(node, tmp_path, Clock(), events)
    agent.run_pass()
    assert api.wait_for_writes(1)
    events.close()
    method, path, _, body = api.writes[0]
    assert (method, path) == ("POST", "/apis/events.k8s.io/v1/namespaces/cni-reaper/events")
    meta = body["metadata"]
    assert isinstance(meta, dict) and meta["namespace"] == "cni-reaper"
