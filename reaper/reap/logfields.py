"""What a log line about reclaiming an attachment says of it."""

from __future__ import annotations

from reaper.model import Attachment, AttachmentKey, ReclaimMethod, ReclaimOutcome

METHOD_ORDER: tuple[ReclaimMethod, ...] = ("cni-del", "kernel", "quarantine")


def reclaim_log_fields(attachment: Attachment | None, outcome: ReclaimOutcome) -> dict[str, str]:
    """attachment_log_fields, and how its resources went: the methods used, `+`-joined in order."""
    methods = "+".join(m for m in METHOD_ORDER if any(r.method == m for r in outcome.resources))
    return attachment_log_fields(outcome.key, attachment) | ({"method": methods} if methods else {})


def attachment_log_fields(key: AttachmentKey, attachment: Attachment | None) -> dict[str, str]:
    """Its container ID, network and ifname (or its pin) and the pod its CNI_ARGS name, if any
    (Attachment.pod: Kubernetes names, with no `/`, space or newline to forge a field or line)."""
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
