"""What DEL each orphan gets, and what it keeps: decided from the look's records, the conf
dir's configs and the node's trust (reaper.reap.trust), before anything is touched.

Nothing here acts; its only reads are the files a DEL will read (reaper.reap.delegates) and
whether the pin passed as CNI_NETNS is still there (netns_for_del). reaper.reap.act acts.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from msgspec import Struct
from msgspec.structs import replace

from reaper.cni.requests import DelRequest, UnfitArgs, request_from_cache, safe_ifname
from reaper.kinds import Kind, R, cache, veth
from reaper.kinds.netconf import FREES_WITHOUT_NETNS, FREES_WITHOUT_NETNS_IF_LISTED_HERE, stateful_plugins
from reaper.kinds.registry import REGISTRY, Registry
from reaper.model import Attachment, Identity, NetworkConfig, NodeSnapshot, NsKey, PlannedAttachment
from reaper.reap import delegates
from reaper.reap.plan import plan_attachment
from reaper.reap.trust import (
    NO_KERNEL_EVIDENCE,
    NodeTrust,
    cached_config_refusal,
    kernel_proven,
    node_trust,
    proven_namespaces,
)

Records = Mapping[Identity, Any]

NO_PIN = "no plugin runs: no namespace pin to pass as CNI_NETNS, as the runtime would"
NOT_LISTED_HERE = (
    "no plugin runs: Calico frees by container ID in the cluster's datastore, so its DEL runs with no "
    "netns only for a sandbox a runtime of this node listed to this agent, for the pod the entry "
    "names, and lists no more (never in a one-shot run)"
)
DROPPED = "no plugin runs: --drop-waiting names it; its files go as files"
# The CNI_ARGS keys Calico reads the pod from (Go's LoadArgs: exact field names, the last pair wins).
POD_ARGS = ("K8S_POD_NAMESPACE", "K8S_POD_NAME")


def index(snapshot: NodeSnapshot, registry: Registry = REGISTRY) -> dict[Identity, Any]:
    """Every record of a snapshot by its kind's identity of it."""
    return {kind.identity(r): r for kind in registry.kinds for r in snapshot.of(kind.name)}


def netns_for_del(attachment: Attachment, records: Records, registry: Registry) -> str:
    """CNI_NETNS for DEL: the attachment's pin when it is still there, else empty (no DEL runs).
    Looked at again, not taken from the look: nothing later checks the path (docs/design.md)."""
    for ref in attachment.resources:
        pin = registry.pin_of(ref, records)
        if pin is not None and os.path.exists(pin.path):
            return pin.path
    return ""


def held_by_others(
    snapshot: NodeSnapshot, orphans: Sequence[Attachment], registry: Registry
) -> tuple[set[str], set[str]]:
    """(addresses as written, host veth names) that records outside every orphan hold; a result's
    other host interfaces are shared ones (the bridge every pod hangs off)."""
    judged = {ref.identity for a in orphans for ref in a.resources}
    ips: set[str] = set()
    for kind in registry.kinds:
        if kind.claims is not None:
            ips.update(ip for r in snapshot.of(kind.name) if kind.identity(r) not in judged for ip in kind.claims(r))
    links = veth.KIND.records(snapshot)
    return ips, {veth.host_ifname(link) for link in links if veth.identity(link) not in judged}


def _cached_request(attachment: Attachment, records: Records, netns: str) -> tuple[DelRequest, object] | None:
    """DEL as the attachment's cache entry would run it, with the entry's result (or None); None
    without a usable entry; UnfitArgs when its CNI_ARGS cannot be sent."""
    key = attachment.key
    if key.container_id is None or key.network is None or key.ifname is None:
        return None
    entries = _records_of(cache.KIND, attachment, records)
    document = cache.del_document(entries) if entries else None
    if document is None:
        return None
    doc, path = document
    request = request_from_cache(doc, key.container_id, key.network, key.ifname, netns, path)
    return (request, doc.get("result")) if request is not None else None


def pins_of(attachments: Sequence[Attachment], records: Records, registry: Registry) -> dict[NsKey, str]:
    """The namespaces the attachments' own pins hold, each with the path of one pin."""
    found: dict[NsKey, str] = {}
    for attachment in attachments:
        for ref in attachment.resources:
            pin = registry.pin_of(ref, records)
            if pin is not None:
                found.setdefault(pin.ns, pin.path)
    return found


def _records_of(kind: Kind[R], attachment: Attachment, records: Records) -> list[R]:
    """The attachment's records of `kind` that the look found, in the attachment's order."""
    return [record for ref in attachment.resources if (record := kind.record(ref, records)) is not None]


def del_request(
    attachment: Attachment,
    records: Records,
    configs: Sequence[NetworkConfig],
    trust: NodeTrust,
    registry: Registry = REGISTRY,
) -> tuple[DelRequest | None, str | None]:
    """What DEL would run for this attachment (_config_request), and why not; with flannel or
    multus only while the file each reads passes reaper.reap.delegates."""
    request, note = _config_request(attachment, records, configs, trust, registry)
    if request is None:
        return None, note
    found, refusal = delegates.delegations_of(request, trust)
    if refusal is not None:
        return None, f"delegate file not run: {refusal}"
    return (replace(request, delegations=found) if found else request), note


def _config_request(
    attachment: Attachment, records: Records, configs: Sequence[NetworkConfig], trust: NodeTrust, registry: Registry
) -> tuple[DelRequest | None, str | None]:
    """What DEL would run, and why the cache entry's config does not when it does not: nothing
    unless the kernel proves the attachment (reaper.reap.trust); then that config when the node
    vouches for it, else the conf dir's, else nothing."""
    key = attachment.key
    if key.container_id is None or key.network is None:
        return None, None
    if not kernel_proven(attachment, records, trust, registry):
        return _or_else(without_netns_request(attachment, records, configs, trust), NO_KERNEL_EVIDENCE)
    netns = netns_for_del(attachment, records, registry)
    if not netns:
        # Some plugins (kindnet) take an empty CNI_NETNS as "nothing to do" and answer success.
        return _or_else(without_netns_request(attachment, records, configs, trust), NO_PIN)
    refusal = None
    try:
        cached = _cached_request(attachment, records, netns)
    except UnfitArgs as err:
        # Not the conf dir's config either: no DEL runs with other args than the ADD's.
        return None, f"no plugin runs: {err}"
    if cached is not None:
        request, result = cached
        refusal = cached_config_refusal(attachment, request.config, result, trust)
        if refusal is None:
            return request, None
    note = f"cached config not run: {refusal}" if refusal is not None else None
    config = _conf_dir_config(configs, key.network)
    if config is None:
        return None, note
    return DelRequest(
        container_id=key.container_id,
        network=key.network,
        ifname=safe_ifname(key.ifname),
        netns=netns,
        config=config.raw,
        source=config.path,
    ), note


def _conf_dir_config(configs: Sequence[NetworkConfig], network: str | None) -> NetworkConfig | None:
    """The node's own config of `network`: the first, which wins a shared name as in libcni."""
    return next((c for c in configs if c.name == network and not c.cached), None)


def _or_else(found: tuple[DelRequest | None, str | None], note: str) -> tuple[DelRequest | None, str | None]:
    """A DEL with no netns (without_netns_request), or `note` when there is none and no refusal."""
    request, refusal = found
    return (request, None) if request is not None else (None, refusal or note)


def without_netns_request(
    attachment: Attachment, records: Records, configs: Sequence[NetworkConfig], trust: NodeTrust
) -> tuple[DelRequest | None, str | None]:
    """DEL as containerd 2.3 and CRI-O 1.36 run it once the netns is gone (cni-facts.md section
    8): CNI_NETNS empty, the cached result and config. Only in no namespace, for a stateful chain
    whose every stateful plugin frees by container ID (FREES_WITHOUT_NETNS; calico only for a
    sandbox listed here and gone, for the pod its CNI_ARGS name), with a config the node vouches
    for, never the conf dir's in its place. (None, why) when the chain qualifies but its config
    may not run; (None, None) when no such DEL applies. Why: docs/design.md."""
    key = attachment.key
    if attachment.netns is not None or key.container_id is None or key.network is None or key.ifname is None:
        return None, None
    try:
        cached = _cached_request(attachment, records, "")
    except UnfitArgs as err:
        return None, f"no plugin runs: {err}"
    if cached is None:
        return None, None
    request, result = cached
    chain = stateful_chain(attachment, records, configs, request)
    if isinstance(chain, str) or not chain:
        return None, None
    needs_proof = set(chain) - FREES_WITHOUT_NETNS
    if not needs_proof <= FREES_WITHOUT_NETNS_IF_LISTED_HERE:
        return None, None
    pod = trust.gone_here.get(key.container_id)
    if needs_proof and (pod is None or not names_pod(request.cni_args, pod)):
        return None, NOT_LISTED_HERE
    refusal = cached_config_refusal(attachment, request.config, result, trust)
    if refusal is not None:
        return None, f"cached config not run: {refusal}"
    return replace(request, without_netns=True), None


def names_pod(cni_args: Iterable[tuple[str, str]], pod: tuple[str, str]) -> bool:
    """CNI_ARGS name `pod` (namespace, name) and no other: each key of POD_ARGS is there, and
    every pair whose key is one of them, in any case, holds its value."""
    want = {key.lower(): value for key, value in zip(POD_ARGS, pod, strict=True)}
    found = set()
    for key, value in cni_args:
        if key.lower() in want:
            if value != want[key.lower()]:
                return False
            found.add(key)
    return found >= set(POD_ARGS)


def stateful_chain(
    attachment: Attachment, records: Records, configs: Sequence[NetworkConfig], request: DelRequest | None
) -> list[str] | str | None:
    """The plugins of the attachment's chain that keep state only their own DEL frees (maybe
    none); why they cannot be known, when they cannot; None when no file a DEL needs is left."""
    entries = _records_of(cache.KIND, attachment, records)
    if not entries:
        return None
    raws = [raw for raw in map(cache.cached_config, entries) if raw is not None]
    if not raws:
        config = _conf_dir_config(configs, attachment.key.network)
        raws = [config.raw] if config is not None else []
    if request is not None:
        raws.append(request.config)
    if not raws:
        return "a chain no config names"
    stateful: list[str] = []
    for raw in raws:
        found = stateful_plugins(raw)
        if found is None:
            return "a chain whose config cannot be read"
        stateful += [kind for kind in found if kind not in stateful]
    return stateful


def kept_state(
    attachment: Attachment, records: Records, configs: Sequence[NetworkConfig], request: DelRequest | None
) -> str | None:
    """The plugins of its chain (the cache entry's, else the conf dir's, plus what DEL would run)
    that keep state only their own DEL frees, which keeps its cache entry past a failed or
    missing DEL; None when all are known stateless (netconf.STATELESS_PLUGINS)."""
    chain = stateful_chain(attachment, records, configs, request)
    if isinstance(chain, str) or chain is None:
        return chain
    return ", ".join(chain)[:200] if chain else None


def could_wait(attachment: Attachment, registry: Registry = REGISTRY) -> bool:
    """Whether all that is left are the files a DEL needs (the `last` kinds'), with no namespace."""
    return attachment.netns is None and all(ref.kind in registry.last for ref in attachment.resources)


def waits_for_plugin(
    attachment: Attachment,
    records: Records,
    configs: Sequence[NetworkConfig],
    trust: NodeTrust | None,
    registry: Registry = REGISTRY,
) -> str | None:
    """Why a pass can do nothing for this orphan (docs/design.md, "Orphans that wait"), or None:
    only the files a DEL needs are left, its chain keeps state (kept_state), and no DEL can run
    (without_netns_request). `trust`: None when no plugin runs (--method kernel)."""
    if not could_wait(attachment, registry):
        return None
    what = kept_state(attachment, records, configs, None)
    if what is None:
        return None
    refusal = None
    if trust is not None:
        request, refusal = without_netns_request(attachment, records, configs, trust)
        if request is not None:
            return None
    if refusal is not None:
        why = "no DEL runs: " + refusal.removeprefix("no plugin runs: ")
    elif trust is None:
        why = "no plugin runs (--method kernel)"
    else:
        why = "no DEL runs without a netns pin"
    return f"waits: only what a DEL needs is left, {what} may keep state only that DEL frees, and {why}"


class OrphanPlan(Struct, frozen=True, kw_only=True):
    """What a pass does for one orphan, decided before anything is touched."""

    planned: PlannedAttachment  # its steps, where DEL takes its config from, and why not (config_note)
    request: DelRequest | None  # the DEL it gets; None: no plugin runs
    keep: str | None  # kept_state: why its cache entry outlives a DEL that fails or does not run


def plan_orphan(
    attachment: Attachment,
    records: Records,
    configs: Sequence[NetworkConfig],
    trust: NodeTrust,
    *,
    kernel_only: bool,
    quarantine: bool,
    costless: bool = False,
    dropped: bool = False,
    registry: Registry = REGISTRY,
) -> OrphanPlan:
    """What a pass (and `reaper explain`) does for `attachment`. `costless`: plan.costs_nothing,
    no DEL runs; `dropped`: --drop-waiting names it, its files go as files, nothing is kept."""
    if dropped:
        request, note = None, DROPPED
    elif kernel_only or costless:
        request, note = None, None
    else:
        request, note = del_request(attachment, records, configs, trust, registry)
    keep = None if dropped else kept_state(attachment, records, configs, request)
    planned = plan_attachment(attachment, request, note, quarantine, registry)
    return OrphanPlan(planned=planned, request=request, keep=keep)


def orphan_trust(
    snapshot: NodeSnapshot,
    records: Records,
    orphans: Sequence[Attachment],
    allow_plugins: Iterable[str],
    *,
    waiting: Sequence[Attachment] = (),
    gone_here: Mapping[str, tuple[str, str]] | None = None,
    registry: Registry,
) -> NodeTrust:
    """What the node vouches for when `orphans` are weighed (trust.node_trust): the conf dir's
    configs, --allow-plugin, what every other attachment holds (the `waiting` count as orphans),
    what the kernel proves of the orphans, and the sandboxes listed here and gone."""
    own = (c for c in snapshot.configs if not c.cached)
    held = held_by_others(snapshot, [*orphans, *waiting], registry)
    proven = proven_namespaces(orphans, records, registry)
    return node_trust(own, allow_plugins, *held, proven=proven, gone_here=gone_here)
