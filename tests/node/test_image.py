"""The project's image, built from the Dockerfile by podman and run the way the Helm chart runs it.

No base image can be pulled here, so the Dockerfile's BASE is a Debian bookworm made by
debootstrap (tests/harness/debian_base.py, cached between runs). That tree names no
snapshot.debian.org state (Debian's images do), and the snapshot archive cannot be reached from
here either, so the build installs with DEBIAN_SNAPSHOT=live; tests/packaging/test_apt_snapshot.py
checks what `base` and a snapshot time do to the sources. The build borrows the host's CA
bundle and pip config; nothing of them may be in the image. The container then gets what the
chart's DaemonSet asks for, read from the rendered manifest: privileged, the host's PID
namespace, a read-only root with the chart's /tmp, the chart's host paths with their mount
propagation, the chart's arguments, and the lab's netns standing in for the node's network. It
reaps a real lab: the leaks go, the live pods keep everything, and the pins it unmounts are gone
on the host, not only in the container.
"""

from __future__ import annotations

import copy
import json
import re
import secrets
import shutil
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import helm_python as helm
import pytest
import yaml

from tests.harness import debian_base
from tests.harness.agent import http_get
from tests.harness.image import ULIMITS, ChartPod, PodmanError, PrivatePodman, expand, lend_pip_home
from tests.harness.lab import Lab, PortMap, kernel
from tests.harness.reap_helpers import SCAN, hostport_chains, leak_left, pings
from tests.harness.reaper_cli import attachments_by_key, run_reaper

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "cni-reaper"
TAG = "localhost/cni-reaper:test"
MANIFEST = "/usr/share/cni-reaper/debian-packages.txt"
TOOL_PACKAGES = ("iptables", "nftables", "iproute2")
SYSTEM_CNI_BIN = "/usr/lib/cni"  # where the lab's bin dir links point

pytestmark = pytest.mark.skipif(
    shutil.which("podman") is None or shutil.which("debootstrap") is None,
    reason="needs podman and debootstrap (make deps)",
)

Key = tuple[str | None, str | None, str | None]


@dataclass
class Built:
    podman: PrivatePodman
    base: str
    base_diff_ids: list[str]
    import_seconds: float
    build_seconds: float


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Built]:
    work = tmp_path_factory.mktemp("image")
    podman = PrivatePodman(work / "podman")
    try:
        tree = debian_base.bookworm_python()
        base = f"localhost/cni-reaper-test/bookworm-python:{tree.key}"
        started = time.monotonic()
        podman.import_tree(tree.rootfs, base)
        imported = time.monotonic()
        podman.build(TAG, base, lend_pip_home(work / "home"), args={"DEBIAN_SNAPSHOT": "live"})
        done = time.monotonic()
        diff_ids = podman.inspect(base)["RootFS"]["Layers"]
        yield Built(podman, base, diff_ids, imported - started, done - imported)
    finally:
        podman.close()


def in_image(built: Built, entrypoint: str, *args: str) -> subprocess.CompletedProcess[str]:
    return built.podman("run", "--rm", *ULIMITS, "--network", "none", "--entrypoint", entrypoint, TAG, *args)


def test_image_runs_the_agent_from_its_venv_with_the_recorded_tools(built: Built) -> None:
    # The venv copied from the builder stage works in the final one: its interpreter link
    # resolves (both stages share BASE) and the entry point imports the whole agent.
    check = "import os, sys, reaper.cli, reaper.agent; print(sys.prefix, os.path.realpath(sys.executable))"
    prefix, interpreter = in_image(built, "/opt/venv/bin/python", "-c", check).stdout.split()
    assert prefix == "/opt/venv" and interpreter.startswith("/usr/bin/python3.11")
    usage = built.podman("run", "--rm", *ULIMITS, "--network", "none", TAG, "--help").stdout
    assert all(command in usage for command in ("scan", "reap", "run", "doctor"))
    # Debian's tools, and the manifest of every package version the build installed: what the
    # image's dpkg says, line for line, from the sources the build used. The base's own apt
    # sources are back in place (the snapshot pin is the build's only).
    manifest = in_image(built, "cat", MANIFEST).stdout.splitlines()
    listed = [line for line in manifest if not line.startswith("#")]
    status = "${db:Status-Status} ${Package}=${Version}\n"
    dpkg = in_image(built, "dpkg-query", "-W", "-f", status).stdout.split("\n")
    assert listed == sorted(line.split()[1] for line in dpkg if line.startswith("installed "))
    versions = dict(line.split("=", 1) for line in listed)
    assert set(versions) >= set(TOOL_PACKAGES)
    assert "#   http://deb.debian.org/debian" in manifest
    print("image tools:", ", ".join(f"{name}={versions[name]}" for name in TOOL_PACKAGES))
    sources = "/etc/apt/sources.list.d/debian.sources"
    in_base = built.podman("run", "--rm", *ULIMITS, "--network", "none", built.base, "cat", sources).stdout
    assert in_image(built, "cat", sources).stdout == in_base
    wanted = ("iptables-save", "iptables-restore", "ip6tables-save", "nft", "ip", "nsenter")
    found = in_image(built, "sh", "-c", 'for t in "$@"; do command -v "$t"; done', "-", *wanted).stdout.split()
    assert [Path(t).name for t in found] == list(wanted)
    config = built.podman.inspect(TAG)["Config"]
    assert config["Entrypoint"] == ["reaper"] and config["Cmd"] == ["run"]
    assert config.get("User") in ("0:0", "0", "root")


def test_nothing_lent_to_the_build_is_in_the_image(built: Built) -> None:
    lent = re.compile(r"(\./)?(etc/pip\.conf|etc/ssl/certs/.|root/\.config|root/\.pip)")
    # What the apt step mounts or sets aside for the build only (image/apt-snapshot.sh).
    apt_step = re.compile(
        r"(\./)?(run/apt-snapshot\.sh|etc/apt/apt\.conf\.d/99cni-reaper-snapshot|var/lib/apt/cni-reaper-debian\.sources"
        r"|etc/apt/sources\.list\.d/debian\.sources\.new)$"
    )
    above_base = 0
    seen_layers = 0
    for diff_id, layer in built.podman.layers(TAG):
        if diff_id in built.base_diff_ids:
            continue
        seen_layers += 1
        for member in layer.getmembers():
            assert not lent.match(member.name), f"{member.name} was lent to the build and is in the image"
            assert not apt_step.match(member.name), f"{member.name} is the apt step's own and is in the image"
            above_base += member.size
    assert seen_layers >= 2, "the apt layer and the venv layer"
    # The Dockerfile's own layers (tools and venv) stay small.
    assert above_base < 120 * 2**20, f"{above_base / 2**20:.0f} MiB above the base"
    # Nor is anything the RUN steps mounted left as a mount point.
    assert in_image(built, "sh", "-c", "test ! -e /etc/pip.conf && test ! -e /root/.config").returncode == 0


def test_the_default_snapshot_refuses_a_base_that_names_none(built: Built, tmp_path: Path) -> None:
    # DEBIAN_SNAPSHOT=base (the default) on the debootstrap tree, whose sources name no snapshot:
    # the build stops at the apt step and says what to pass, rather than installing whatever the
    # live mirror holds under a digest that promised otherwise. The builder stage is cached.
    with pytest.raises(PodmanError, match=re.escape("names no snapshot for http://deb.debian.org/debian")) as refused:
        built.podman.build("localhost/cni-reaper:refused", built.base, lend_pip_home(tmp_path / "home"))
    assert "DEBIAN_SNAPSHOT" in str(refused.value)
    assert built.podman("image", "exists", "localhost/cni-reaper:refused", check=False).returncode == 1


# --- on the lab ----------------------------------------------------------------------------------


def chart_values(lab: Lab, state_dir: Path, mode: str) -> dict[str, Any]:
    """The chart's values for a node laid out as the lab is (its plugins link into /usr/lib/cni,
    which the chart mounts as a second bin dir)."""
    state_dir.mkdir(exist_ok=True)
    return {
        # Any name: the pod runs the image built here; the chart refuses its placeholder.
        "image": {"repository": "localhost/cni-reaper", "tag": "test"},
        "mode": mode,
        "runtimeEndpoint": lab.endpoint,
        "netnsDirs": [str(lab.netns_dir)],
        "ipamDirs": [str(lab.ipam_dir)],
        "cniCacheDir": str(lab.cache_dir),
        "cniConfDir": str(lab.conf_dir),
        "cniBinDirs": [str(lab.bin_dir), SYSTEM_CNI_BIN],
        "stateFile": str(state_dir / "state.json"),
        "minAge": "1s",
        "confirmations": 1,
        "maxOrphanRatio": 1,
        "interval": "5s",
    }


def chart_pod(values: dict[str, Any]) -> ChartPod:
    with helm.Chart.load(CHART) as chart:
        rendered = chart.render(copy.deepcopy(values), name="cni-reaper", namespace="kube-system")
    docs = [d for path, text in rendered.items() if path.endswith(".yaml") for d in yaml.safe_load_all(text) if d]
    return ChartPod.from_manifests(docs)


def live_attachments(lab: Lab, state: Path) -> dict[Key, list[tuple[str, str]]]:
    run = run_reaper(lab, "scan", state, "--json", *SCAN)
    assert run.returncode in (0, 1), run.stderr
    return {
        key: sorted((r["kind"], r["name"]) for r in a["resources"])
        for key, a in attachments_by_key(run.doc).items()
        if a["verdict"] == "live"
    }


def host_mount_points() -> set[str]:
    return {m.mount_point for m in kernel.mountinfo()}


def test_the_image_reaps_the_lab_as_the_chart_runs_it(built: Built, lab: Lab, tmp_path: Path) -> None:
    web = lab.run_pod("web", port_mappings=[PortMap(8080, 80)])
    db = lab.run_pod("db")
    cached = lab.make_leak(with_cache=True, port_mappings=[PortMap(9090, 90)])
    bare = lab.make_leak(with_cache=False)
    pins = [cached.netns_path, bare.netns_path]
    assert {str(p) for p in pins} <= host_mount_points()
    live = live_attachments(lab, tmp_path / "before.json")
    assert len(live) == 4  # web and db: eth0 and cni-loopback each
    assert hostport_chains(lab) == 2
    time.sleep(1.1)  # the chart's minAge here

    pod = chart_pod(chart_values(lab, tmp_path / "state", "reap"))
    flags = pod.podman_flags(lab.netns_path, {})
    name = f"cni-reaper-reap-{secrets.token_hex(3)}"
    try:
        run = built.podman("run", "--rm", "--name", name, *flags, TAG, "reap", "--json", *pod.reap_args(), check=False)
    finally:
        pod.remove_made()
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    doc = json.loads(run.stdout)
    by_cid = {r["container_id"]: r for r in doc["reclaimed"]}
    assert {cached.container_id, bare.container_id} <= set(by_cid)
    assert all(r["ok"] for o in doc["reclaimed"] for r in o["resources"])
    # The cached leak went through the plugins' DEL, run inside the container from the chart's
    # read-only bin dirs, iptables included.
    methods = {r["kind"]: r["method"] for r in by_cid[cached.container_id]["resources"]}
    assert methods["ipam"] == "cni-del" and methods["iptables"] == "cni-del", methods

    # Gone on the host: leases, veths, chains, cache entries, and the pins, unmounted through the
    # Bidirectional mount (a mount left on the host would keep the namespace alive).
    assert leak_left(lab, cached) == [] and leak_left(lab, bare) == []
    assert not {str(p) for p in pins} & host_mount_points()
    assert not any(p.exists() for p in pins)
    assert (tmp_path / "state" / "state.json").is_file(), "the state dir is the host's"
    # The live pods keep every resource and still answer.
    assert live_attachments(lab, tmp_path / "after.json") == live
    assert hostport_chains(lab) == 1
    assert pings(lab, web) and pings(lab, db)


def wait_for(lab: Lab, url: str, timeout: float) -> tuple[float, str]:
    started = time.monotonic()
    last: tuple[int, str] = (0, "")
    while time.monotonic() - started < timeout:
        last = http_get(lab, url, timeout=2.0)
        if last[0] == 200:
            return time.monotonic() - started, last[1]
        time.sleep(0.1)
    raise AssertionError(f"{url} never answered 200; last {last}")


def test_the_agent_starts_answers_its_probes_and_stops_as_the_chart_runs_it(
    built: Built, lab: Lab, tmp_path: Path
) -> None:
    if not lab.sandboxes():
        lab.run_pod("web")  # the bridge gets its gateway address with the first pod
    node_ip = lab.subnet.rsplit(".", 1)[0] + ".1"
    pod = chart_pod(chart_values(lab, tmp_path / "state", "scan"))
    env = {"NODE_IP": node_ip}
    flags = pod.podman_flags(lab.netns_path, env)
    args = expand(pod.args, env)
    name = f"cni-reaper-agent-{secrets.token_hex(3)}"
    port = pod.container["ports"][0]["containerPort"]
    base = f"http://{node_ip}:{port}"
    # The kubelet restarts a container whose liveness probe failed failureThreshold times: the
    # last of those probes starts (failureThreshold - 1) periods after the initial delay and fails
    # at its timeout. /healthz must answer before that; how soon it does is printed below.
    liveness = pod.container["livenessProbe"]
    restarted_at = (
        liveness["initialDelaySeconds"]
        + (liveness["failureThreshold"] - 1) * liveness["periodSeconds"]
        + liveness["timeoutSeconds"]
    )
    started = time.monotonic()
    try:
        built.podman("run", "-d", "--name", name, *flags, TAG, *args)
        _, body = wait_for(lab, base + liveness["httpGet"]["path"], restarted_at)
        healthy = time.monotonic() - started  # from `podman run`: the container's start included
        assert body == "ok\n"
        wait_for(lab, base + pod.container["readinessProbe"]["httpGet"]["path"], 60)
        ready = time.monotonic() - started
        metrics = http_get(lab, base + "/metrics", timeout=2.0)[1]
        assert re.search(r"^cni_reaper_runtime_up 1\.0$", metrics, re.M), "the runtime's socket dir is mounted"
        assert re.search(r"^cni_reaper_passes_total\{outcome=\"ok\"\} [1-9]", metrics, re.M)
        stop = built.podman("stop", "-t", "10", name, timeout=60)
        assert stop.returncode == 0
        state = built.podman.inspect(name)["State"]
        assert state["ExitCode"] == 0, "SIGTERM: the step under way finishes, exit 0"
        logs = built.podman("logs", name).stdout + built.podman("logs", name).stderr
        assert '"agent stopped"' in logs
        print(f"agent: /healthz {healthy:.2f}s and /readyz {ready:.2f}s after podman run")
    finally:
        built.podman("rm", "-f", "-t", "0", name, check=False)
        pod.remove_made()
