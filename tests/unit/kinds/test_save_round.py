"""A look reads the filter table (the firewall kind's) and the nat table (the iptables kind's)
in one round of `iptables-save` runs, every family side by side, each table once a pass."""

from __future__ import annotations

from pathlib import Path

import pytest

from reaper.host.memo import InventoryMemo
from reaper.kinds import Look, firewall, iptables
from tests.harness.passes import options_at

CHAIN = "CNI-0123456789abcdef01234567"
RULE = "-A CNI-FORWARD -s 10.88.0.5/32 -j ACCEPT"
OUTPUTS = {
    ("iptables-nft-save", "nat"): f"*nat\n:POSTROUTING ACCEPT [0:0]\n:{CHAIN} - [0:0]\nCOMMIT\n",
    ("iptables-nft-save", "filter"): f"*filter\n:CNI-FORWARD - [0:0]\n{RULE}\nCOMMIT\n",
    ("ip6tables-nft-save", "nat"): "*nat\nCOMMIT\n",
    ("ip6tables-nft-save", "filter"): "*filter\nCOMMIT\n",
}
# Each save notes its start, then waits (at most 5 s) until the other table's save of its
# family has started too: run one table at a time, it waits in vain and fails.
SAVE = """#!/bin/sh
PATH=/usr/bin:/bin
tool=$(basename "$0")
echo "$tool $2" >> {log}
i=0
while [ "$(grep -c "^$tool " {log})" -lt 2 ]; do
    i=$((i + 1))
    if [ "$i" -gt 100 ]; then echo "$tool -t $2 ran alone" >&2; exit 3; fi
    sleep 0.05
done
cat {out}/"$tool.$2"
"""


@pytest.fixture
def tools(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Fake nft-backend save and restore tools, alone on PATH; the log of the saves run."""
    sbin, out, log = tmp_path / "sbin", tmp_path / "out", tmp_path / "saves.log"
    sbin.mkdir()
    out.mkdir()
    log.write_text("")
    for (tool, table), text in OUTPUTS.items():
        (out / f"{tool}.{table}").write_text(text)
    for prefix in ("iptables", "ip6tables"):
        save = sbin / f"{prefix}-nft-save"
        save.write_text(SAVE.format(log=log, out=out))
        restore = sbin / f"{prefix}-nft-restore"
        restore.write_text("#!/bin/sh\nexit 0\n")
        save.chmod(0o755)
        restore.chmod(0o755)
    monkeypatch.setenv("PATH", str(sbin))
    return log


def test_a_look_saves_filter_and_nat_side_by_side_each_once_a_pass(tools: Path, tmp_path: Path) -> None:
    memo = InventoryMemo()
    for one_pass in (1, 2):
        memo.start_pass()
        look = Look(options_at(tmp_path / "cni"), memo, (), {})
        rules, chains = firewall.find(look), iptables.find(look)
        memo.end_pass()
        assert rules.errors == () and chains.errors == ()
        assert [r.rule for r in rules.records] == [RULE]
        assert [c.chain for c in chains.records] == [CHAIN]
        ran = tools.read_text().splitlines()
        assert sorted(ran) == sorted([f"{tool} {table}" for tool, table in OUTPUTS] * one_pass)  # once a pass


def test_a_second_find_in_one_pass_saves_its_table_again(tools: Path, tmp_path: Path) -> None:
    memo = InventoryMemo()
    memo.start_pass()
    look = Look(options_at(tmp_path / "cni"), memo, (), {})
    firewall.find(look)
    iptables.find(look)
    assert [c.chain for c in iptables.find(look).records] == [CHAIN]
    assert tools.read_text().splitlines().count("iptables-nft-save nat") == 2  # read again, as it is now
