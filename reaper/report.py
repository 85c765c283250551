"""How a scan is shown: one JSON object, or a table for a person."""

from __future__ import annotations

from typing import Any

from reaper.durations import format_duration
from reaper.model import VERDICTS, Attachment, AttachmentKey, ReapResult, ResourceRef, RuntimeView, ScanReport
from reaper.settings import Settings


def _resource(ref: ResourceRef, now: float) -> dict[str, Any]:
    age = {} if ref.created_at is None else {"age_seconds": round(max(0.0, now - ref.created_at), 3)}
    return {"kind": ref.kind, "name": ref.name, **age, **ref.details}


def attachment_json(a: Attachment, now: float) -> dict[str, Any]:
    return {
        "container_id": a.key.container_id,
        "network": a.key.network,
        "ifname": a.key.ifname,
        "verdict": a.verdict,
        "owner": a.owner,
        "pod": a.pod,
        "reason": a.reason,
        "age_seconds": round(a.age_seconds, 3),
        "resources": [_resource(r, now) for r in a.resources],
    }


def layout_json(settings: Settings) -> dict[str, Any]:
    """The dirs layout detection may fill in: each value, and where it came from."""
    find = settings.find
    values = {
        "--cni-conf-dir": find.conf_dir,
        "--cni-bin-dir": list(find.bin_dirs),
        "--netns-dir": list(find.netns_dirs),
        "--namespaces-dir": list(find.namespaces_dirs),
    }
    return {
        "dirs": {flag: {"value": values[flag], "from": origin} for flag, origin in settings.origins},
        # The detected conf dir above and the other runtimes' conf dirs: the node's own configs.
        "conf_dirs": list(find.conf_dirs),
        "problems": [*settings.given_problems, *settings.layout_problems],
        "pod_cidrs": None
        if find.pod_cidrs is None
        else {"v4": find.pod_cidrs.v4, "v6": find.pod_cidrs.v6, "from": find.pod_cidrs.source},
    }


def report_json(report: ScanReport) -> dict[str, Any]:
    now = report.taken_at
    rt = report.runtime
    return {
        "runtime": {
            "endpoint": rt.endpoint,
            "name": rt.name,
            "version": rt.version,
            "reachable": rt.reachable,
            "error": rt.error,
        },
        "runtimes": [
            {
                "endpoint": a.endpoint,
                "found_by": a.source,
                "name": a.name,
                "version": a.version,
                "reachable": a.reachable,
                "skipped": a.skipped,
                "sandboxes": a.sandboxes,
                "error": a.error,
            }
            for a in rt.runtimes
        ],
        "live_sandboxes": len(rt.sandboxes),
        "stuck_sandboxes": [
            {
                "id": s.id,
                "name": s.name,
                "namespace": s.namespace,
                "age_seconds": round(s.age_seconds, 3),
                "resources": [_resource(r, now) for r in s.resources],
            }
            for s in report.stuck_sandboxes
        ],
        "attachments": [attachment_json(a, now) for a in report.attachments],
        "corrupt": [{"kind": c.kind, "path": c.path, "error": c.error, "count": c.count} for c in report.corrupt],
        "errors": [{"source": e.source, "error": e.error} for e in report.errors],
        "ipam_ranges": [
            {"network": r.network, "range": r.range, "size": r.size, "used": r.used} for r in report.ranges
        ],
        "unconfirmed": [{**_resource(u.resource, now), "why": u.why} for u in report.unconfirmed],
        "foreign_netns": [{"name": p.name, "path": p.path, "pids": p.holders} for p in report.foreign_pins],
        "summary": {v: report.count(v) for v in VERDICTS},
    }


def _elide(name: str, width: int = 40) -> str:
    if len(name) <= width:
        return name
    half = (width - 3) // 2
    return f"{name[:half]}...{name[-half:]}"


def _resources_text(resources: tuple[ResourceRef, ...]) -> str:
    return ", ".join(f"{r.kind} {_elide(r.name)}" for r in resources)


def _short(value: str | None, width: int) -> str:
    if value is None:
        return "-"
    return value if len(value) <= width else value[: width - 1] + "~"


def runtime_lines(rt: RuntimeView) -> list[str]:
    """What each runtime said this pass, a line each; and, when not all answered, that nothing can be called orphan."""
    lines = []
    for answer in rt.runtimes:
        who = " ".join(x for x in (answer.name, answer.version) if x) or "runtime"
        if answer.reachable:
            lines.append(f"runtime: {who} at {answer.endpoint}, {answer.sandboxes} sandboxes listed")
        else:
            state = "skipped" if answer.skipped else "FAILED"
            lines.append(f"runtime: {state} at {answer.endpoint} ({answer.source}): {answer.error}")
    if not rt.reachable:
        # Each runtime's error is on its own line above; only with none to list is the why here.
        why = "" if rt.runtimes else f" ({rt.error})"
        lines.append(f"runtime: UNREACHABLE{why}; no attachment can be called orphan this pass")
    return lines


def report_table(report: ScanReport) -> str:
    lines = runtime_lines(report.runtime)
    for verdict in ("orphan", "waiting", "pending", "excluded", "unknown", "live"):
        group = [a for a in report.attachments if a.verdict == verdict]
        if not group:
            continue
        lines += ["", f"{verdict.upper()} ({len(group)})"]
        lines.append(f"  {'CONTAINER':<13} {'NETWORK':<20} {'IF':<6} {'OWNER':<7} {'AGE':>5}  RESOURCES / REASON")
        for a in group:
            lines.append(
                f"  {_short(a.key.container_id, 13):<13} {_short(a.key.network, 20):<20} "
                f"{_short(a.key.ifname, 6):<6} {a.owner:<7} {format_duration(a.age_seconds):>5}  "
                f"{_resources_text(a.resources)}"
            )
            lines.append(f"  {'':<13} {'':<20} {'':<6} {'':<7} {'':>5}  ({a.reason})")
    if report.stuck_sandboxes:
        lines += ["", f"STUCK SANDBOXES ({len(report.stuck_sandboxes)}): NOTREADY, kept by the runtime"]
        for s in report.stuck_sandboxes:
            held = _resources_text(s.resources) or "nothing"
            lines.append(f"  {s.id[:13]:<13} {s.namespace}/{s.name}  {format_duration(s.age_seconds)}  holds: {held}")
    if report.corrupt:
        lines += ["", f"CORRUPT OR UNREADABLE FILES ({sum(c.count for c in report.corrupt)})"]
        lines += [f"  {c.kind:<7} {c.path}: {c.error}" for c in report.corrupt]
    if report.errors:
        lines += ["", f"SOURCES THAT FAILED ({len(report.errors)})"]
        lines += [f"  {e.source}: {e.error}" for e in report.errors]
    if report.ranges:
        lines += ["", "IPAM RANGES"]
        for r in report.ranges:
            pct = 100.0 * r.used / r.size if r.size else 0.0
            lines.append(f"  {r.network:<20} {r.range:<28} {r.used:>6}/{r.size:<6} {pct:5.1f}% used")
    if report.unconfirmed:
        lines += ["", f"UNCONFIRMED, NEVER TOUCHED ({len(report.unconfirmed)}): their key matches no attachment"]
        lines += [f"  {u.resource.kind:<8} {_elide(u.resource.name)}: {u.why}" for u in report.unconfirmed]
    if report.foreign_pins:
        names = ", ".join(p.name for p in report.foreign_pins)
        lines += ["", f"NOT CNI'S, NEVER TOUCHED ({len(report.foreign_pins)} netns): {names}"]
    summary = ", ".join(f"{v} {report.count(v)}" for v in VERDICTS)
    lines += ["", f"attachments: {summary}"]
    return "\n".join(lines)


def _key_json(key: AttachmentKey) -> dict[str, str | None]:
    return {"container_id": key.container_id, "network": key.network, "ifname": key.ifname, "netns_pin": key.pin}


def reap_json(result: ReapResult) -> dict[str, Any]:
    doc = report_json(result.report)
    doc["breaker"] = {"open": result.breaker_open, "reason": result.breaker_reason}
    if result.recheck_error is not None:
        doc["recheck_error"] = result.recheck_error
    doc["plan"] = [
        {
            **_key_json(p.key),
            "config": p.config_source,
            "config_note": p.config_note,
            "steps": [{"kind": s.kind, "name": s.name, "method": s.method} for s in p.steps],
        }
        for p in result.plan
    ]
    doc["reclaimed"] = [
        {
            **_key_json(o.key),
            "resources": [
                {"kind": r.kind, "name": r.name, "method": r.method, "ok": r.ok, "error": r.error} for r in o.resources
            ],
            "plugin_errors": list(o.plugin_errors),
            "needs_plugin": o.needs_plugin,
        }
        for o in result.reclaimed
    ]
    doc["skipped"] = [
        {"container_id": s.key.container_id, "network": s.key.network, "reason": s.reason} for s in result.skipped
    ]
    doc["timings"] = dict(result.timings)
    return doc


def reap_table(result: ReapResult, dry_run: bool) -> str:
    lines = [report_table(result.report)]
    if result.breaker_open:
        lines += ["", f"BREAKER OPEN: {result.breaker_reason}"]
    if dry_run and result.plan:
        lines += ["", f"PLAN (dry run, nothing changed): {len(result.plan)} attachments"]
        for p in result.plan:
            who = f"{_short(p.key.container_id, 13)} {p.key.network or '-'}/{p.key.ifname or '-'}"
            lines.append(f"  {who}  config: {p.config_source or 'none (kernel only)'}")
            if p.config_note:
                lines.append(f"  {' ' * len(who)}  {p.config_note}")
            for step in p.steps:
                lines.append(f"      {step.method:<10} {step.kind} {_elide(step.name)}")
    if result.reclaimed:
        ok = sum(1 for o in result.reclaimed if o.ok)
        lines += ["", f"RECLAIMED ({ok} of {len(result.reclaimed)} attachments completely)"]
        for o in result.reclaimed:
            who = f"{_short(o.key.container_id, 13)} {o.key.network or '-'}/{o.key.ifname or '-'}"
            lines.append(f"  {'ok  ' if o.ok else 'FAIL'} {who}")
            for r in o.resources:
                state = "freed" if r.ok else f"LEFT: {r.error}"
                lines.append(f"      {r.method:<10} {r.kind} {_elide(r.name)}  {state}")
            if o.needs_plugin:
                lines.append(f"      NEEDS PLUGIN {o.needs_plugin}: its cache entry is kept; only its DEL frees it")
            for err in o.plugin_errors:
                lines.append(f"      plugin DEL error: {err}")
    if result.skipped:
        lines += ["", f"SKIPPED ({len(result.skipped)})"]
        for skip in result.skipped:
            lines.append(f"  {_short(skip.key.container_id, 13)} {skip.key.network or '-'}: {skip.reason}")
    return "\n".join(lines)
