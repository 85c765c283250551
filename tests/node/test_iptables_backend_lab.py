"""Plugin DELs see the node's iptables backend (issue 35, item 4), with both backends, real parts.

The real bridge (ipMasq) and portmap plugins ADD a leak's rules with an `iptables` of one
backend on PATH, as a node's runtime would; the lab's netns says which backend the node uses
the way kubelet says it (its KUBE-IPTABLES-HINT chain in mangle, which kube-proxy's
iptables-wrapper reads first). The real `reaper reap` then runs the plugins' DEL: the plugins'
own deletes must land in that backend (the chains' method is `cni-del`, not the kernel step's
fallback), whatever `iptables` the reaper's own userland has. The reaper's userland is changed
for one run only, in a mount namespace of its own (a tmpfs over /usr/local/sbin, the first entry
of the plugins' PATH).

Everything stays in the lab's netns: legacy tables are per netns too, and the module checks that
the host netns's legacy tables and nft ruleset are as they were.
"""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.harness.lab import Lab
from tests.harness.lab.cni import Leak, PortMap
from tests.harness.reap_helpers import REAP
from tests.harness.reaper_cli import ReaperRun, lab_flags, run_reaper

TOOLS = ("iptables", "iptables-save", "iptables-restore", "ip6tables", "ip6tables-save", "ip6tables-restore")
HINT = "KUBE-IPTABLES-HINT"


def host_firewall() -> tuple[str, str, str]:
    """The host netns's legacy tables (read from /proc, which loads nothing) and nft ruleset."""
    tables = tuple(Path(f"/proc/net/{name}").read_text() for name in ("ip_tables_names", "ip6_tables_names"))
    ruleset = subprocess.run(["nft", "list", "ruleset"], capture_output=True, text=True, check=True).stdout
    return tables[0], tables[1], ruleset


@pytest.fixture(scope="module", autouse=True)
def host_netns_untouched() -> Iterator[None]:
    """Running iptables-legacy inside the lab's netns loads no table or rule into the host's."""
    before = host_firewall()
    yield
    assert host_firewall() == before


def backend_dir(path: Path, backend: str) -> Path:
    """A dir whose iptables tools are `backend`'s (links to Debian's iptables-<backend> tools)."""
    path.mkdir(mode=0o700)
    for tool in TOOLS:
        family, _, verb = tool.partition("-")
        (path / tool).symlink_to(f"/usr/sbin/{family}-{backend}{'-' + verb if verb else ''}")
    return path


def leak_made_with(lab: Lab, monkeypatch: pytest.MonkeyPatch, tools: Path, port: int) -> Leak:
    """A leak (bridge with ipMasq, portmap with a hostPort) whose plugins ran with `tools` first
    on PATH, so their rules are in that backend."""
    with monkeypatch.context() as patched:
        patched.setenv("PATH", f"{tools}:/usr/sbin:/usr/bin:/sbin:/bin")
        return lab.make_leak(with_cache=True, port_mappings=(PortMap(port, 80),))


def saved(lab: Lab, backend: str) -> str:
    return lab.run_in_netns([f"iptables-{backend}-save", "-t", "nat"], check=True).stdout


def chains_of(lab: Lab, leak: Leak, backend: str) -> set[str]:
    """The leak's per-attachment chains (masquerade, hostport) in `backend`'s nat table."""
    text = saved(lab, backend)
    masq = {leak.masq_chain} if f":{leak.masq_chain} " in text else set()
    port = f"--dport {leak.port_mappings[0].host_port} "
    dnat = {line.split()[1] for line in text.splitlines() if line.startswith("-A CNI-DN-") and port in line}
    return masq | dnat


def with_plain_iptables(target_dir: str) -> list[str]:
    """A wrap for run_reaper: the reaper runs in a mount namespace of its own where
    /usr/local/sbin (first on the plugins' PATH) holds the tools of `target_dir` (links, or the
    fakes the test wrote there); the host's /usr/local/sbin is not touched."""
    script = (
        "mount -t tmpfs -o mode=0755 cni-reaper-test /usr/local/sbin\n"
        f"for t in {' '.join(TOOLS)}; do ln -s {shlex.quote(target_dir)}/$t /usr/local/sbin/$t; done\n"
        'exec "$@"\n'
    )
    return ["unshare", "--mount", "--propagation", "slave", "sh", "-ec", script, "sh"]


def hint_in(lab: Lab, backend: str) -> Iterator[None]:
    lab.run_in_netns([f"iptables-{backend}", "-t", "mangle", "-N", HINT], check=True)
    try:
        yield
    finally:
        lab.run_in_netns([f"iptables-{backend}", "-t", "mangle", "-X", HINT], check=True)


@pytest.fixture
def legacy_node(lab: Lab) -> Iterator[None]:
    """The node's kubelet chose legacy: its hint chain is in legacy's mangle table (lab netns)."""
    yield from hint_in(lab, "legacy")


@pytest.fixture
def nft_node(lab: Lab) -> Iterator[None]:
    yield from hint_in(lab, "nft")


def iptables_methods(run: ReaperRun, leak: Leak) -> dict[str, tuple[str, bool]]:
    (outcome,) = [o for o in run.doc["reclaimed"] if o["container_id"] == leak.container_id]
    resources: list[dict[str, Any]] = outcome["resources"]
    return {r["name"]: (r["method"], r["ok"]) for r in resources if r["kind"] == "iptables"}


@pytest.mark.usefixtures("legacy_node")
def test_on_a_legacy_node_the_plugins_del_removes_their_legacy_rules(
    lab: Lab, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    leak = leak_made_with(lab, monkeypatch, backend_dir(tmp_path / "legacy", "legacy"), 28431)
    assert chains_of(lab, leak, "legacy") and not chains_of(lab, leak, "nft")
    run = run_reaper(lab, "reap", tmp_path / "state.json", "--json", *REAP)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    methods = iptables_methods(run, leak)
    # The plugins' own DEL removed them (the reaper's image runs nft's `iptables` by default).
    assert methods and set(methods.values()) == {("cni-del", True)}, methods
    assert not chains_of(lab, leak, "legacy")
    assert "plugin DELs use iptables legacy (kubelet's chain is in legacy); from a private dir" in run.stderr
    assert not (tmp_path / "state.json.iptables").exists(), "the private dir goes with the pass"


@pytest.mark.usefixtures("nft_node")
def test_on_an_nft_node_the_plugins_del_removes_their_nft_rules_from_a_legacy_userland(
    lab: Lab, tmp_path: Path
) -> None:
    leak = lab.make_leak(with_cache=True, port_mappings=(PortMap(28432, 80),))
    assert chains_of(lab, leak, "nft")
    legacy_tools = backend_dir(tmp_path / "legacy", "legacy")
    run = run_reaper(lab, "reap", tmp_path / "state.json", "--json", *REAP, wrap=with_plain_iptables(str(legacy_tools)))
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    methods = iptables_methods(run, leak)
    assert methods and set(methods.values()) == {("cni-del", True)}, methods
    assert not chains_of(lab, leak, "nft")


FAKE = """#!/bin/sh
echo "$0 $*" >> {marker}
exit 1
"""


@pytest.mark.usefixtures("legacy_node")
def test_a_fake_iptables_on_path_or_in_the_bin_dir_is_never_what_a_plugin_runs(
    lab: Lab, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A PATH entry (the first of the plugins' PATH) and the CNI bin dir hold an `iptables`
    that records each run: the plugins run the node's backend from the system dirs instead."""
    leak = leak_made_with(lab, monkeypatch, backend_dir(tmp_path / "legacy", "legacy"), 28433)
    marker = tmp_path / "fake-ran"
    fakes = tmp_path / "fakes"
    fakes.mkdir()
    for tool in TOOLS:
        (fakes / tool).write_text(FAKE.format(marker=shlex.quote(str(marker))))
        (fakes / tool).chmod(0o755)
    in_bin = [lab.install_plugin(tool, FAKE.format(marker=shlex.quote(str(marker)))) for tool in TOOLS]
    try:
        run = run_reaper(lab, "reap", tmp_path / "state.json", "--json", *REAP, wrap=with_plain_iptables(str(fakes)))
    finally:
        for path in in_bin:
            path.unlink()
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert not marker.exists(), marker.read_text()
    methods = iptables_methods(run, leak)
    assert methods and set(methods.values()) == {("cni-del", True)}, methods
    assert not chains_of(lab, leak, "legacy")


@pytest.mark.usefixtures("legacy_node")
def test_doctor_says_which_backend_plugin_dels_run(lab: Lab, tmp_path: Path) -> None:
    """`reaper doctor` in the netns it checks (the lab's, kubelet's chain in legacy) names it."""
    flags = lab_flags(lab, tmp_path / "state.json")
    flags = flags[: flags.index("--state-file")]  # doctor keeps no state
    argv = ["nsenter", f"--net={lab.netns_path}", sys.executable, "-m", "reaper", "doctor", "--json", *flags]
    out = subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False)
    checks: list[dict[str, str]] = json.loads(out.stdout)["checks"]
    (check,) = [c for c in checks if c["check"] == "iptables" and "plugin DELs" in c["message"]]
    assert check["status"] == "ok", check
    assert "use iptables legacy (kubelet's chain is in legacy)" in check["message"], check
    assert "private dir" in check["message"], check
