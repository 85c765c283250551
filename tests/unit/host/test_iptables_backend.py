"""The node's iptables backend for plugin DELs (reaper.host.iptables_backend): the choice from
rule counts and kubelet's chains, the tools found in system dirs only, and the private dir.

The "system dirs" here are the test's own, holding a shell script in the place of each
backend's xtables-*-multi and the tools as links to it, as Debian installs them; the script
prints what the test put beside it for a save, as the real ones dispatch on their name."""

from __future__ import annotations

import os
import shutil
import stat
import tempfile
from pathlib import Path

import pytest
from msgspec.structs import replace

from reaper.cni.invoke import PluginEnv, run_plugin
from reaper.doctor import plugin_iptables
from reaper.host.iptables_backend import (
    BACKENDS,
    TOOLS,
    Backend,
    BackendChoice,
    BackendRules,
    PathPlan,
    ToolRefused,
    backend_tool,
    choose_backend,
    plan_plugin_path,
    plugin_path,
    trusted_tool,
)

HINT = ":KUBE-IPTABLES-HINT - [0:0]\n"
CANARY = ":KUBE-KUBELET-CANARY - [0:0]\n"


def rules(backend: Backend, count: int, *, hinted: bool = False, unread: str | None = None) -> BackendRules:
    return BackendRules(backend=backend, hinted=hinted, rules=count, unread=unread)


@pytest.mark.parametrize(
    ("nft", "legacy", "chosen"),
    [
        (rules("nft", 0, hinted=True), rules("legacy", 900, hinted=True), "nft"),  # nft's chain is looked at first
        (rules("nft", 900), rules("legacy", 3, hinted=True), "legacy"),  # a chain beats any count
        (rules("nft", 5), rules("legacy", 6), "legacy"),
        (rules("nft", 6), rules("legacy", 5), "nft"),
        (rules("nft", 5), rules("legacy", 5), None),  # a tie decides nothing
        (rules("nft", 0), rules("legacy", 0), None),
        (rules("nft", 0, unread="iptables-nft-save failed"), rules("legacy", 4), None),  # a count not all read
        (rules("nft", 0, unread="failed", hinted=False), rules("legacy", 0, hinted=True), "legacy"),
    ],
)
def test_the_choice_is_iptables_wrappers_rule(nft: BackendRules, legacy: BackendRules, chosen: str | None) -> None:
    choice = choose_backend(nft, legacy)
    assert choice.backend == chosen, choice


def test_backend_tool_names() -> None:
    assert [backend_tool(t, "legacy") for t in TOOLS] == [
        "iptables-legacy",
        "iptables-legacy-save",
        "iptables-legacy-restore",
        "ip6tables-legacy",
        "ip6tables-legacy-save",
        "ip6tables-legacy-restore",
    ]


MULTI = """#!/bin/sh
name=$(basename "$0")
echo "$name $*" >> {ran}
case "$name" in
  *-save) if [ "$1" = -t ]; then exec cat {out}/"$name.$2"; else exec cat {out}/"$name"; fi ;;
esac
exit 0
"""


class Node:
    """A system dir with both backends' tools, what their saves print, and legacy table lists."""

    def __init__(self, root: Path) -> None:
        self.sbin = root / "sbin"
        self.sbin.mkdir(mode=0o755)
        self.out = root / "out"
        self.out.mkdir()
        self.ran = root / "ran"
        self.ran.touch()
        self.proc = root / "proc"
        self.proc.mkdir()
        self.legacy_tables = {"iptables": str(self.proc / "ip_tables_names"), "ip6tables": str(self.proc / "ip6")}
        for names in self.legacy_tables.values():
            Path(names).write_text("")
        for backend in BACKENDS:
            multi = self.sbin / f"xtables-{backend}-multi"
            multi.write_text(MULTI.format(ran=self.ran, out=self.out))
            multi.chmod(0o755)
            for tool in TOOLS:
                (self.sbin / backend_tool(tool, backend)).symlink_to(multi.name)
                (self.out / backend_tool(tool, backend)).write_text("")
                (self.out / f"{backend_tool(tool, backend)}.mangle").write_text("")

    def saves(self, backend: str, text: str, family: str = "iptables") -> None:
        """What a whole save prints, and its mangle table alone (`-t mangle`)."""
        (self.out / f"{family}-{backend}-save").write_text(text)
        mangle = text[text.index("*mangle") :] if "*mangle" in text else ""
        (self.out / f"{family}-{backend}-save.mangle").write_text(mangle[: mangle.find("COMMIT") + 7])

    def legacy_in_use(self, *tables: str) -> None:
        Path(self.legacy_tables["iptables"]).write_text("\n".join(tables or ("nat", "filter", "mangle")) + "\n")

    def saves_run(self) -> list[str]:
        return [line.strip() for line in self.ran.read_text().splitlines() if "-save" in line]

    def plain(self, where: Path, backend: Backend) -> str:
        """A PATH whose plain tools are `backend`'s (as Debian's alternatives make them)."""
        where.mkdir()
        for tool in TOOLS:
            (where / tool).symlink_to(self.sbin / backend_tool(tool, backend))
        return str(where)

    def plan(self, base_path: str) -> PathPlan:
        return plan_plugin_path(base_path, dirs=(str(self.sbin),), legacy_tables=self.legacy_tables)


@pytest.fixture
def node(tmp_path: Path) -> Node:
    return Node(tmp_path)


def test_kubelets_chain_in_legacy_gives_the_plugins_legacy_links(node: Node, tmp_path: Path) -> None:
    node.legacy_in_use()
    node.saves("legacy", "*mangle\n" + HINT + "COMMIT\n")
    node.saves("nft", "*nat\n-A POSTROUTING -j MASQUERADE\n-A POSTROUTING -j ACCEPT\nCOMMIT\n")
    plan = node.plan(node.plain(tmp_path / "path", "nft"))
    assert plan.choice == BackendChoice(backend="legacy", reason="kubelet's chain is in legacy")
    assert dict(plan.links) == {tool: str(node.sbin / "xtables-legacy-multi") for tool in TOOLS}
    assert plan.problem is None


def test_the_plain_tools_already_the_choice_need_no_private_dir(node: Node, tmp_path: Path) -> None:
    node.saves("nft", "*mangle\n" + CANARY + "COMMIT\n", family="ip6tables")
    plan = node.plan(node.plain(tmp_path / "path", "nft"))
    assert plan.choice.backend == "nft" and plan.links == ()
    assert "already is" in plan.describe()


def test_legacy_is_not_read_where_no_legacy_table_exists(node: Node, tmp_path: Path) -> None:
    node.saves("nft", "*nat\n-A POSTROUTING -j MASQUERADE\nCOMMIT\n")
    plan = node.plan(node.plain(tmp_path / "path", "legacy"))
    ran = node.saves_run()
    assert "iptables-nft-save" in ran and not [name for name in ran if "legacy" in name], ran
    assert plan.choice.backend == "nft" and dict(plan.links)["iptables"] == str(node.sbin / "xtables-nft-multi")


def test_more_rules_in_legacy_choose_legacy(node: Node, tmp_path: Path) -> None:
    node.legacy_in_use()
    node.saves("legacy", "*filter\n-A INPUT -j ACCEPT\n-A FORWARD -j ACCEPT\nCOMMIT\n")
    node.saves("nft", "*filter\n-A INPUT -j ACCEPT\nCOMMIT\n")
    plan = node.plan(node.plain(tmp_path / "path", "nft"))
    assert plan.choice.backend == "legacy" and "2 rules in legacy, 1 in nft" in plan.choice.reason


def test_a_save_that_fails_decides_nothing(node: Node, tmp_path: Path) -> None:
    node.legacy_in_use()
    (node.out / "iptables-legacy-save").unlink()  # cat fails: the save exits 1
    node.saves("nft", "*filter\n-A INPUT -j ACCEPT\nCOMMIT\n")
    plan = node.plan(node.plain(tmp_path / "path", "nft"))
    assert plan.choice.backend is None and "iptables-legacy-save failed" in plan.choice.reason
    assert plan.links == ()


def test_a_fake_iptables_first_on_path_is_passed_over(node: Node, tmp_path: Path) -> None:
    """A writable dir first on the plugins' PATH holds an `iptables`: the plan does not take it
    for the chosen backend, and the given PATH finds the system dir's tool first."""
    node.saves("nft", "*mangle\n" + HINT + "COMMIT\n")
    writable = tmp_path / "writable"
    writable.mkdir()
    writable.chmod(0o777)
    fake = writable / "iptables"
    fake.write_text("#!/bin/sh\nexit 0\n")
    fake.chmod(0o755)
    base = f"{writable}:{node.plain(tmp_path / 'path', 'nft')}"
    plan = node.plan(base)
    assert plan.choice.backend == "nft" and plan.links, plan
    with plugin_path(plan, base) as given:
        assert given.path.endswith(":" + base)
        for tool in TOOLS:
            found = shutil.which(tool, path=given.path)
            assert found is not None and os.path.realpath(found) == str(node.sbin / "xtables-nft-multi")


def test_the_private_dir_is_0700_first_on_path_and_gone_after(node: Node, tmp_path: Path) -> None:
    plan = PathPlan(
        choice=BackendChoice(backend="legacy", reason="test"),
        links=tuple((tool, str(node.sbin / "xtables-legacy-multi")) for tool in TOOLS),
    )
    with plugin_path(plan, "/usr/bin:/bin") as given:
        private, rest = given.path.split(":", 1)
        assert rest == "/usr/bin:/bin" and given.problem is None
        st = os.lstat(private)
        assert stat.S_ISDIR(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o700 and st.st_uid == os.geteuid()
        assert sorted(os.listdir(private)) == sorted(TOOLS)
        assert {os.readlink(os.path.join(private, t)) for t in TOOLS} == {str(node.sbin / "xtables-legacy-multi")}
    assert not os.path.exists(private)


def test_no_plan_or_no_links_keeps_the_path(tmp_path: Path) -> None:
    with plugin_path(None, "/usr/bin") as given:
        assert given.path == "/usr/bin"
    plan = PathPlan(choice=BackendChoice(backend=None, reason="tie"))
    with plugin_path(plan, "/usr/bin") as given:
        assert given.path == "/usr/bin"


def test_a_tool_in_a_dir_others_may_write_is_refused(node: Node, tmp_path: Path) -> None:
    open_dir = tmp_path / "open"
    open_dir.mkdir()
    shutil.copy(node.sbin / "xtables-nft-multi", open_dir / "iptables-nft")
    open_dir.chmod(0o777)
    with pytest.raises(ToolRefused, match="may be written by others"):
        trusted_tool("iptables-nft", dirs=(str(open_dir), str(node.sbin)))  # the next dir is not tried


def test_a_tool_others_may_write_is_refused(node: Node) -> None:
    (node.sbin / "xtables-nft-multi").chmod(0o775)
    with pytest.raises(ToolRefused, match="only root may write"):
        trusted_tool("iptables-nft", dirs=(str(node.sbin),))


def test_a_link_into_a_writable_dir_is_refused(node: Node, tmp_path: Path) -> None:
    open_dir = tmp_path / "open"
    open_dir.mkdir()
    shutil.copy(node.sbin / "xtables-nft-multi", open_dir / "multi")
    open_dir.chmod(0o777)
    (node.sbin / "iptables-nft").unlink()
    (node.sbin / "iptables-nft").symlink_to(open_dir / "multi")
    with pytest.raises(ToolRefused, match="may be written by others"):
        trusted_tool("iptables-nft", dirs=(str(node.sbin),))


def test_a_missing_tool_is_refused_and_the_plan_says_so(node: Node, tmp_path: Path) -> None:
    with pytest.raises(ToolRefused, match="in none of"):
        trusted_tool("iptables-none", dirs=(str(node.sbin),))
    node.legacy_in_use()
    node.saves("legacy", "*mangle\n" + HINT + "COMMIT\n")
    base = node.plain(tmp_path / "path", "nft")
    (node.sbin / "ip6tables-legacy-restore").unlink()
    node.saves("nft", "*nat\n-A POSTROUTING -j MASQUERADE\nCOMMIT\n")
    plan = node.plan(base)
    # Legacy cannot be read without all its tools: nothing names a backend, the PATH stays.
    assert plan.choice.backend is None and "ip6tables-legacy-restore" in plan.choice.reason and plan.links == ()


def test_a_plugin_runs_with_the_given_path(tmp_path: Path) -> None:
    seen = tmp_path / "seen"
    plugin = tmp_path / "says-path"
    plugin.write_text(f'#!/bin/sh\necho "$PATH" > {seen}\necho "{{}}"\n')
    plugin.chmod(0o755)
    env = PluginEnv(command="DEL", container_id="c" * 64, netns="", ifname="eth0", args=(), bin_dirs=(str(tmp_path),))
    run_plugin("says-path", {"cniVersion": "1.0.0"}, replace(env, path="/x:/usr/bin:/bin"), 10)
    assert seen.read_text().strip() == "/x:/usr/bin:/bin"
    run_plugin("says-path", {"cniVersion": "1.0.0"}, env, 10)
    assert seen.read_text().strip() == "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def test_doctor_warns_when_the_nodes_backend_cannot_be_given() -> None:
    choice = BackendChoice(backend="legacy", reason="kubelet's chain is in legacy")
    check = plugin_iptables(PathPlan(choice=choice, problem="iptables-legacy is in none of /usr/sbin"))
    assert check.status == "warn" and "iptables-legacy is in none of /usr/sbin" in check.message and check.fix
    assert plugin_iptables(PathPlan(choice=choice, links=(("iptables", "/usr/sbin/x"),))).status == "ok"


def legacy_plan(node: Node) -> PathPlan:
    return PathPlan(
        choice=BackendChoice(backend="legacy", reason="test"),
        links=tuple((tool, str(node.sbin / "xtables-legacy-multi")) for tool in TOOLS),
    )


def test_beside_the_state_file_a_killed_passs_leftover_is_replaced(node: Node, tmp_path: Path) -> None:
    """`<state file>.iptables`: a dir a killed pass left goes, and a link planted there is
    removed as a link (what it points to stays)."""
    state_dir = tmp_path / "state"
    state_dir.mkdir(mode=0o700)
    state = state_dir / "state.json"
    fixed = state_dir / "state.json.iptables"
    fixed.mkdir()
    (fixed / "iptables").symlink_to("/bin/false")
    with plugin_path(legacy_plan(node), "/bin", beside=str(state)) as given:
        assert given.path == f"{fixed}:/bin"
        assert os.readlink(fixed / "iptables") == str(node.sbin / "xtables-legacy-multi")
    assert not fixed.exists()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "keep").touch()
    fixed.symlink_to(elsewhere)
    with plugin_path(legacy_plan(node), "/bin", beside=str(state)) as given:
        assert given.path == f"{fixed}:/bin" and not fixed.is_symlink()
    assert (elsewhere / "keep").exists() and not os.path.lexists(fixed)


def test_a_state_dir_others_may_write_is_not_used(node: Node, tmp_path: Path) -> None:
    """A dir without the sticky bit that others may write (as a pod's emptyDir is) is never
    where the links go: the temp dir's mkdtemp dir is, when it passes."""
    open_dir = tmp_path / "open"
    open_dir.mkdir()
    open_dir.chmod(0o777)
    with plugin_path(legacy_plan(node), "/bin", beside=str(open_dir / "state.json")) as given:
        private = given.path.split(":", 1)[0]
        assert given.problem is None and not private.startswith(str(open_dir))
        assert os.path.basename(private).startswith("cni-reaper-iptables-")
    assert not os.listdir(open_dir)
    assert not os.path.exists(private)


def test_with_no_safe_dir_the_path_stays_and_the_problem_is_said(
    node: Node, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    open_dir = tmp_path / "open"
    open_dir.mkdir()
    open_dir.chmod(0o777)
    monkeypatch.setattr(tempfile, "tempdir", str(open_dir))
    with plugin_path(legacy_plan(node), "/bin", beside=str(open_dir / "state.json")) as given:
        assert given.path == "/bin"
        assert given.problem is not None and "may be written by others" in given.problem, given.problem
    assert not os.listdir(open_dir)


def test_kubelets_chain_is_looked_for_in_mangle_and_no_rule_is_counted(node: Node, tmp_path: Path) -> None:
    node.legacy_in_use()
    node.saves("legacy", "*filter\n-A INPUT -j ACCEPT\nCOMMIT\n*mangle\n" + HINT + "COMMIT\n")
    plan = node.plan(node.plain(tmp_path / "path", "nft"))
    assert plan.choice.backend == "legacy"
    assert sorted(node.saves_run()) == [
        "ip6tables-nft-save -t mangle",
        "iptables-legacy-save -t mangle",
        "iptables-nft-save -t mangle",
    ]


def test_a_legacy_family_without_mangle_is_not_asked_for_it(node: Node, tmp_path: Path) -> None:
    """Asking iptables-legacy-save for a table the kernel does not have would create it."""
    node.legacy_in_use("nat")
    node.saves("legacy", "*nat\n-A POSTROUTING -j MASQUERADE\nCOMMIT\n")
    plan = node.plan(node.plain(tmp_path / "path", "nft"))
    assert plan.choice.backend == "legacy" and "1 rules in legacy, 0 in nft" in plan.choice.reason
    assert [r for r in node.saves_run() if "legacy" in r] == ["iptables-legacy-save"]
