"""CNI_ARGS a DEL sends from a cache entry's cniArgs: IgnoreUnknown is the reaper's, every key and
value can be sent as it was written, and the whole stays far under the kernel's exec limit. An
entry that cannot be sent so runs no plugin at all (not even the conf dir's config): the kinds
reclaim its files, and the plan says why in one line.

The real host-local's DEL with a hostile IgnoreUnknown is in tests/node/test_cni_args_lab.py.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
from msgspec.structs import replace

from reaper.cni.requests import IGNORE_UNKNOWN, MAX_CNI_ARGS, UnfitArgs, cni_args_of, request_from_cache
from reaper.kinds import cache, hostlocal, netns
from reaper.kinds.netconf import parse_network_config
from reaper.model import Attachment, AttachmentKey, Identity, NsKey
from reaper.reap.requests import del_request
from reaper.reap.trust import node_trust
from tests.harness import snapshots
from tests.harness.configs import cache_doc, conflist
from tests.harness.probe import probe_argv
from tests.harness.probes import small_stack

CID = "c" * 64
NET = "net1"
OWN = json.loads(conflist(NET))
POD = [["K8S_POD_NAMESPACE", "default"], ["K8S_POD_NAME", "web-0"]]
SENT = (IGNORE_UNKNOWN, ("K8S_POD_NAMESPACE", "default"), ("K8S_POD_NAME", "web-0"))


@pytest.mark.parametrize(
    "own",
    [
        [["IgnoreUnknown", "false"]],
        [["ignoreunknown", "0"]],
        [["IGNOREUNKNOWN", "False"]],
        [["iGnOrEuNkNoWn", "no"]],
        [["IgnoreUnknown", "1"], ["IgnoreUnknown", "0"]],  # LoadArgs: the last pair wins
    ],
)
def test_an_entrys_own_ignore_unknown_is_dropped_in_any_case_and_the_reapers_sent(own: list[list[str]]) -> None:
    """An entry's IgnoreUnknown=false (or ignoreunknown=0) made the reaper leave out its own
    IgnoreUnknown=1, so host-local's DEL failed `unknown args` on every pass."""
    assert cni_args_of([*own[:1], *POD, *own[1:]]) == SENT
    doc = cache_doc(CID, NET, config=OWN, cniArgs=[*POD, *own])
    request = request_from_cache(doc, CID, NET, "eth0", "/run/netns/x", "entry")
    assert request is not None and request.cni_args == SENT


def test_an_entry_without_cni_args_gets_ignore_unknown_alone() -> None:
    assert cni_args_of(None) == cni_args_of([]) == (IGNORE_UNKNOWN,)


def _refusal(value: object) -> str:
    with pytest.raises(UnfitArgs) as caught:
        cni_args_of(value)
    message = str(caught.value)
    assert "\n" not in message and len(message) < 200, message
    return message


def test_a_200_kb_value_is_refused_in_one_line() -> None:
    """One value of 200 kB made CNI_ARGS longer than the kernel takes for one env string
    (MAX_ARG_STRLEN, 128 KiB): the DEL could never be executed (`Argument list too long`)."""
    message = _refusal([*POD, ["K8S_POD_UID", "u" * 200_000]])
    assert f"more than {MAX_CNI_ARGS}" in message


def test_many_keys_are_refused_by_count_and_by_total() -> None:
    assert "pairs" in _refusal([[f"K{n}", "v"] for n in range(10_000)])
    # Under the count, over the total: 60 values of 400 bytes.
    assert f"more than {MAX_CNI_ARGS}" in _refusal([[f"K{n}", "v" * 400] for n in range(60)])


@pytest.mark.parametrize(
    ("pair", "why"),
    [
        (["A=B", "x"], "key"),
        (["A;IgnoreUnknown", "0"], "key"),  # would send the pair IgnoreUnknown=0=...
        (["K8S_POD_NAME", "web;IgnoreUnknown=0"], "split"),
        (["K8S_POD_NAME", "a=b"], "split"),
        (["K8S_POD_NAME", "web\n"], "control"),
        (["K8S_POD_NAME", "web\x00"], "control"),
        (["", "x"], "key"),
        (["k" * 300, "x"], "more than 256"),
        (["K8S_POD_NAME", "\ud800"], "UTF-8"),
        (["K8S_POD_NAME", 5], "pair of strings"),
        (["K8S_POD_NAME"], "pair of strings"),
    ],
)
def test_a_pair_that_would_split_or_cannot_be_sent_refuses_the_entry(pair: list[Any], why: str) -> None:
    """A `;` or `=` in a key or value was dropped quietly: the DEL then ran with other args than
    the ADD had. Now the entry runs no plugin, and says why."""
    assert why in _refusal([*POD, pair])


def test_the_largest_cni_args_allowed_is_executed_under_the_smallest_stack(tmp_path: Path) -> None:
    """The bound is under what the kernel always takes (ARG_MAX, 32 pages, whatever the stack
    limit): a plugin gets CNI_ARGS of MAX_CNI_ARGS bytes whole. What the kernel refuses (a 200 kB
    value) the reaper's exec reports in one line, and the bound keeps it from ever being tried."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    plugin = bin_dir / "echo-args"
    plugin.write_text('#!/bin/sh\nprintf \'{"size": %d}\' "${#CNI_ARGS}"\n')
    plugin.chmod(0o755)
    pad = MAX_CNI_ARGS - len(";".join(f"{k}={v}" for k, v in SENT) + ";K=")
    assert len(";".join(f"{k}={v}" for k, v in cni_args_of([*POD, ["K", "v" * pad]]))) == MAX_CNI_ARGS
    done = subprocess.run(
        probe_argv(small_stack, str(bin_dir), str(pad)),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[3])},
    )
    assert done.returncode == 0, done.stderr
    fits, refused = done.stdout.splitlines()
    assert json.loads(fits) == {"size": MAX_CNI_ARGS}
    assert refused == "echo-args: cannot execute: Argument list too long"


def _attachment(tmp: Path, args: object) -> tuple[Attachment, dict[Identity, Any]]:
    """A lease, a cache entry with `args` and a real pin (a kernel object proves it)."""
    results = tmp / "cache" / "results"
    results.mkdir(parents=True)
    doc = cache_doc(CID, NET, config=OWN, result={}, cniArgs=args)
    (results / f"{NET}-{CID}-eth0").write_text(json.dumps(doc))
    (entry,) = cache.collect_cache(str(tmp / "cache"), {NET}).entries
    (tmp / "ipam" / NET).mkdir(parents=True)
    (tmp / "ipam" / NET / "10.0.0.9").write_bytes(f"{CID}\r\neth0".encode())
    (lease,) = hostlocal.collect_leases([str(tmp / "ipam")])[0]
    (tmp / "pin").touch()
    pin = replace(snapshots.pin(1), path=str(tmp / "pin"))
    records: dict[Identity, Any] = {cache.identity(entry): entry, hostlocal.identity(lease): lease}
    records[netns.identity(pin)] = pin
    refs = (
        replace(cache.KIND.ref(entry), identity=cache.identity(entry)),
        replace(hostlocal.KIND.ref(lease), identity=hostlocal.identity(lease)),
        replace(netns.KIND.ref(pin), identity=netns.identity(pin)),
    )
    attachment = Attachment(
        key=AttachmentKey(CID, NET, "eth0"),
        resources=refs,
        netns=NsKey(4, 1001),
        verdict="orphan",
        reason="",
        age_seconds=0.0,
    )
    return attachment, records


def test_an_entry_over_the_bound_runs_no_plugin_not_even_the_conf_dirs(tmp_path: Path) -> None:
    """The plan says why in one line; the kinds reclaim the files (no DEL runs with other args
    than the ADD's, and none fails on every pass)."""
    own = parse_network_config(json.dumps(OWN).encode(), f"/etc/cni/net.d/10-{NET}.conflist")
    trust = node_trust([own], (), set(), set())
    attachment, records = _attachment(tmp_path / "fit", POD)
    request, note = del_request(attachment, records, [own], trust)
    assert note is None and request is not None and request.cni_args == SENT
    attachment, records = _attachment(tmp_path / "huge", [*POD, ["K8S_POD_UID", "u" * 200_000]])
    request, note = del_request(attachment, records, [own], trust)
    assert request is None and note is not None
    assert re.fullmatch(r"no plugin runs: cniArgs make a CNI_ARGS of \d+ bytes, more than \d+", note), note
