"""Delegating plugins (flannel, multus): the per-container files their DEL reads, checked by the
rules of a cached config (reaper.reap.trust.delegate_file_refusal), and nothing else read.

A file that fails them, does not parse or cannot be read means no plugin runs. flannel's DEL
then reads a private copy of the checked bytes; multus' files are read again right before its
DEL and must be unchanged. Why, and what stays open: docs/design.md, "Delegate files, checked
and pinned".
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
from collections.abc import Iterator, Mapping
from typing import Any

from msgspec.structs import replace

from reaper.cni.requests import Delegation, DelRequest, PinnedFile
from reaper.host.confined import UnfitFile, read_beneath
from reaper.host.files import describe_oserror
from reaper.host.jsondoc import go_keys, parse_object
from reaper.kinds import flannel, multus
from reaper.kinds.netconf import ConfigError, plugin_list
from reaper.kinds.scratch import MAX_SCRATCH_BYTES, stamp_of
from reaper.reap.trust import DELEGATING_TYPES, NodeTrust, delegate_file_refusal, executed_types

# A multus delegate may not be another multus (flannel may, once its file passed flannel's rules).
NESTED = DELEGATING_TYPES - {flannel.PLUGIN}


class Refused(Exception):
    """No plugin may run: the message says why, in one line."""


def read_pinned(path: str) -> PinnedFile:
    """The file at `path`, reached from / with no symlink on the way, regular and bounded; else Refused."""
    try:
        data, st = read_beneath("/", path, MAX_SCRATCH_BYTES)
    except FileNotFoundError:
        return PinnedFile(path, None)
    except OSError as err:
        raise Refused(f"{path} cannot be read: {describe_oserror(err)}") from None
    except UnfitFile as err:
        raise Refused(f"{path}: {err}") from None
    return PinnedFile(path, stamp_of(st), data)


def _own_plugins(trust: NodeTrust, network: str) -> list[Mapping[str, Any]]:
    own = trust.configs.get(network)
    if own is None:
        return []
    try:
        return [go_keys(p) for p in plugin_list(own.raw)[2]]
    except (ConfigError, ValueError):
        return []


def _cached_results(data: bytes) -> list[Mapping[str, Any]]:
    """What libcni may hand a delegate as prevResult from its cached result: the `result` of a
    cniCacheV1 entry, or the whole file read as a result (libcni's legacy reading)."""
    doc = go_keys(parse_object(data))
    result = doc.get("result")
    return [doc, result] if isinstance(result, dict) else [doc]


def _flannel(index: int, plugin: Mapping[str, Any], request: DelRequest, trust: NodeTrust) -> Delegation:
    try:
        file = read_pinned(flannel.scratch_path(plugin, request.container_id))
        if file.stamp is not None:
            baseline = flannel.delegate_baseline(plugin)
            runs = flannel.delegate_plugins(file.data)
            why = delegate_file_refusal(runs, [baseline], trust, handed=executed_types([baseline]))
            if why is not None:
                raise Refused(f"{file.path}: {why}")
    except ValueError as err:
        raise Refused(f"flannel's file: {err}") from None
    return Delegation(index, flannel.PLUGIN, file)


def _multus(index: int, plugin: Mapping[str, Any], request: DelRequest, trust: NodeTrust) -> Delegation:
    kind = str(plugin.get("type"))
    try:
        file = read_pinned(multus.scratch_path(plugin, request.container_id))
        if file.stamp is None:
            return Delegation(index, kind, file)
        results = []
        for run in multus.delegate_runs(file.data, request.ifname):
            result = read_pinned(multus.result_path(file.path, run, request.container_id))
            results.append(result)
            prev = _cached_results(result.data) if result.stamp is not None else []
            own = _own_plugins(trust, run.network)
            why = delegate_file_refusal(run.plugins, own, trust, prev_results=prev, delegating=NESTED)
            if why is not None:
                raise Refused(f"{file.path}, delegate {run.network}: {why}")
            # A flannel delegate (multus' usual cluster network) reads a file of its own.
            results += [_flannel(0, p, request, trust).file for p in run.plugins if p.get("type") == flannel.PLUGIN]
    except ValueError as err:
        raise Refused(f"multus' file: {err}") from None
    return Delegation(index, kind, file, tuple(results))


def delegations_of(request: DelRequest, trust: NodeTrust) -> tuple[tuple[Delegation, ...], str | None]:
    """(what each delegating plugin of the request will read, as checked; None), or ((), why no plugin may run)."""
    try:
        _, _, plugins = plugin_list(request.config)
    except ConfigError:
        return (), None  # nothing runs: del_network reports the config
    found = []
    try:
        for index, plugin in enumerate(plugins):
            kind = plugin["type"]
            if kind != flannel.PLUGIN and kind not in multus.PLUGINS:
                continue
            try:
                folded = go_keys(plugin)
            except ValueError as err:
                raise Refused(f"its {kind} config: {err}") from None
            check = _flannel if kind == flannel.PLUGIN else _multus
            found.append(check(index, folded, request, trust))
    except Refused as err:
        return (), str(err)
    return tuple(found), None


def _changed(file: PinnedFile) -> str | None:
    try:
        now = read_pinned(file.path)
    except Refused as err:
        return str(err)
    if now.stamp is None:
        return None  # none there now: the plugin finds nothing of it to run
    if file.stamp is None:
        return f"{file.path} appeared since it was checked"
    if (now.stamp, now.data) != (file.stamp, file.data):
        return f"{file.path} changed since it was checked"
    return None


@contextlib.contextmanager
def pinned(request: DelRequest) -> Iterator[tuple[DelRequest | None, str | None]]:
    """(the request to run now, None), its delegating plugins reading only what was checked, or
    (None, why not) when a file multus reads changed; flannel's private dirs go at the end."""
    multus_reads = (f for d in request.delegations if d.plugin_type in multus.PLUGINS for f in (d.file, *d.results))
    changed = next((why for f in multus_reads if (why := _changed(f)) is not None), None)
    if changed is not None:
        yield None, changed
        return
    flannels = [d for d in request.delegations if d.plugin_type == flannel.PLUGIN]
    if not flannels:
        yield request, None
        return
    private = tempfile.mkdtemp(prefix="cni-reaper-flannel-")
    try:
        doc = parse_object(request.config)
        plugins = doc["plugins"] if isinstance(doc.get("plugins"), list) else [doc]
        for delegation in flannels:
            data_dir = os.path.join(private, str(delegation.index))
            os.mkdir(data_dir, 0o700)
            if delegation.file.stamp is not None:
                flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
                fd = os.open(os.path.join(data_dir, request.container_id), flags, 0o600)
                with os.fdopen(fd, "wb") as copy:
                    copy.write(delegation.file.data)
            plugin = plugins[delegation.index]
            for key in [k for k in plugin if k.casefold() == "datadir"]:
                del plugin[key]
            plugin["dataDir"] = data_dir
        yield replace(request, config=json.dumps(doc).encode()), None
    finally:
        shutil.rmtree(private, ignore_errors=True)
