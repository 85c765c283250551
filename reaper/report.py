"""How a scan is shown: one JSON object, or a table for a person."""

from __future__ import annotations

from typing import Any

from reaper.durations import format_duration
from reaper.model import VERDICTS, ResourceRef, ScanReport


def _resource(ref: ResourceRef, now: float) -> dict[str, Any]:
    out: dict[str, Any] = {"kind": ref.kind, "name": ref.name}
    if ref.created_at is not None:
        out["age_seconds"] = round(max(0.0, now - ref.created_at), 3)
    out.update(dict(ref.details))
    return out


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
        "attachments": [
            {
                "container_id": a.key.container_id,
                "network": a.key.network,
                "ifname": a.key.ifname,
                "verdict": a.verdict,
                "reason": a.reason,
                "age_seconds": round(a.age_seconds, 3),
                "resources": [_resource(r, now) for r in a.resources],
            }
            for a in report.attachments
        ],
        "corrupt": [{"kind": c.kind, "path": c.path, "error": c.error} for c in report.corrupt],
        "errors": [{"source": e.source, "error": e.error} for e in report.errors],
        "ipam_ranges": [
            {"network": r.network, "range": r.range, "size": r.size, "used": r.used} for r in report.ranges
        ],
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


def report_table(report: ScanReport) -> str:
    rt = report.runtime
    lines = []
    who = " ".join(x for x in (rt.name, rt.version) if x) or "runtime"
    if rt.reachable:
        lines.append(f"runtime: {who} at {rt.endpoint}, {len(rt.sandboxes)} sandboxes listed")
    else:
        lines.append(f"runtime: UNREACHABLE ({rt.error}); no attachment can be called orphan this pass")
    for verdict in ("orphan", "pending", "unknown", "live"):
        group = [a for a in report.attachments if a.verdict == verdict]
        if not group:
            continue
        lines.append("")
        lines.append(f"{verdict.upper()} ({len(group)})")
        lines.append(f"  {'CONTAINER':<13} {'NETWORK':<20} {'IF':<6} {'AGE':>5}  RESOURCES / REASON")
        for a in group:
            lines.append(
                f"  {_short(a.key.container_id, 13):<13} {_short(a.key.network, 20):<20} "
                f"{_short(a.key.ifname, 6):<6} {format_duration(a.age_seconds):>5}  {_resources_text(a.resources)}"
            )
            lines.append(f"  {'':<13} {'':<20} {'':<6} {'':>5}  ({a.reason})")
    if report.stuck_sandboxes:
        lines.append("")
        lines.append(f"STUCK SANDBOXES ({len(report.stuck_sandboxes)}): NOTREADY, kept by the runtime")
        for s in report.stuck_sandboxes:
            held = _resources_text(s.resources) or "nothing"
            lines.append(f"  {s.id[:13]:<13} {s.namespace}/{s.name}  {format_duration(s.age_seconds)}  holds: {held}")
    if report.corrupt:
        lines.append("")
        lines.append(f"CORRUPT OR UNREADABLE FILES ({len(report.corrupt)})")
        for c in report.corrupt:
            lines.append(f"  {c.kind:<7} {c.path}: {c.error}")
    if report.errors:
        lines.append("")
        lines.append(f"SOURCES THAT FAILED ({len(report.errors)})")
        for e in report.errors:
            lines.append(f"  {e.source}: {e.error}")
    if report.ranges:
        lines.append("")
        lines.append("IPAM RANGES")
        for r in report.ranges:
            pct = 100.0 * r.used / r.size if r.size else 0.0
            lines.append(f"  {r.network:<20} {r.range:<28} {r.used:>6}/{r.size:<6} {pct:5.1f}% used")
    if report.foreign_pins:
        lines.append("")
        names = ", ".join(p.name for p in report.foreign_pins)
        lines.append(f"NOT CNI'S, NEVER TOUCHED ({len(report.foreign_pins)} netns): {names}")
    lines.append("")
    summary = ", ".join(f"{v} {report.count(v)}" for v in VERDICTS)
    lines.append(f"attachments: {summary}")
    return "\n".join(lines)
