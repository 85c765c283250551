"""What a log line about reclaiming an attachment says of it."""

from __future__ import annotations

from reaper.model import Attachment, AttachmentKey, ReclaimMethod, ReclaimOutcome

METHOD_ORDER: tuple[ReclaimMethod, ...] = ("cni-del", "kernel", "quarantine")


def reclaim_log_fields(attachment: Attachment | None, outcome: ReclaimOutcome) -> dict[str, str]:
    """What a reclaim's log line says of the attachment (attachment_log_fields) and how its
    resources went: `cni-del`, `kernel`, `quarantine`, or those that did, joined by `+` in that
    order."""
    methods = "+".join(m for m in METHOD_ORDER if any(r.method == m for r in outcome.resources))
    return attachment_log_fields(outcome.key, attachment) | ({"method": methods} if methods else {})


def attachment_log_fields(key: AttachmentKey, attachment: Attachment | None) -> dict[str, str]:
    """What a log line about reclaiming an attachment says of it: its container ID, network and
    ifname (or its pin, when it has no container) and the pod its cache entry's CNI_ARGS name,
    when one does (Attachment.pod: both parts read as Kubernetes names, so neither holds a `/`,
    a space or a newline that could forge a field or a line)."""
    pod = attachment.pod if attachment is not None else None
    namespace, _, name = pod.partition("/") if pod is not None else (None, None, None)
    fields = {
        "container_id": key.container_id,
        "network": key.network,
        "ifname": key.ifname,
        "netns_pin": key.pin,
        "pod_namespace": namespace,
        "pod_name": name,
    }
    return {field: value for field, value in fields.items() if value is not None}
