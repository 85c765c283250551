"""`reaper`: find (and, in later commands, reclaim) leaked container-network resources."""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence

from reaper.liveness.cri import CriLiveness
from reaper.logs import setup_logging
from reaper.report import report_json, report_table
from reaper.scan import scan_pass
from reaper.settings import SettingsError, add_options, settings_from

EXIT_CLEAN = 0
EXIT_ORPHANS = 1
EXIT_UNDECIDED = 2

DESCRIPTION = """\
Find container-network resources that no live pod owns: pinned network namespaces,
host veths, host-local IP leases, libcni cache entries and the iptables/nftables
chains CNI plugins leave, reconciled against the sandboxes the CRI runtime lists.
"""

SCAN_EPILOG = """\
verdicts:
  live     a listed sandbox (READY or NOTREADY) or a process owns it
  orphan   nothing owns it, it is older than --min-age and was seen so on
           --confirmations consecutive passes (counted in --state-file)
  pending  nothing owns it, but it is too young or not yet confirmed
  unknown  the runtime could not be asked, so nothing is called orphan

exit status: 0 no orphan, 1 orphans found, 2 could not decide (runtime or config)

examples:
  reaper scan                                   # containerd/CRI-O on their default sockets
  reaper scan --json | jq '.attachments[] | select(.verdict=="orphan")'
  reaper scan --runtime-endpoint unix:///run/k3s/containerd/containerd.sock --min-age 30m
"""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="reaper", description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    scan = sub.add_parser(
        "scan",
        help="report which resources are live, orphaned or pending; changes nothing on the node",
        description="Read-only pass: report which container-network resources are leaked.",
        epilog=SCAN_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_options(scan)
    return parser


def _scan(args: argparse.Namespace) -> int:
    settings = settings_from(args)
    log = setup_logging(settings.log_format, settings.log_level)
    if os.geteuid() != 0:
        log.warning("not running as root: namespaces, /proc and iptables may be partly unreadable")
    result = scan_pass(settings, CriLiveness(settings.runtime_endpoint, settings.runtime_timeout), log)
    report = result.report
    if settings.json_output:
        json.dump(report_json(report), sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        print(report_table(report))
    if not report.runtime.reachable:
        print(f"reaper: cannot decide: runtime unreachable: {report.runtime.error}", file=sys.stderr)
        return EXIT_UNDECIDED
    return EXIT_ORPHANS if report.count("orphan") else EXIT_CLEAN


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(sys.argv[1:] if argv is None else list(argv))
    try:
        if args.command == "scan":
            return _scan(args)
    except SettingsError as err:
        print(f"reaper: {err}", file=sys.stderr)
        return EXIT_UNDECIDED
    except KeyboardInterrupt:
        return 130
    parser.error(f"unknown command {args.command}")
    return EXIT_UNDECIDED


if __name__ == "__main__":
    sys.exit(main())
