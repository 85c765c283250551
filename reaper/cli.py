"""`reaper`: find and reclaim leaked container-network resources; explain, plan and check.

Each command imports what it uses when it runs: a one-shot `scan` from a timer pays for no
scheduler, HTTP server, Prometheus client or reclaiming code (`python -X importtime`). Every
command asks the runtimes from this process.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time
from collections.abc import Callable, Sequence
from functools import partial
from typing import TYPE_CHECKING

from msgspec.structs import replace

from reaper.host.jsondoc import dumps_indented
from reaper.host.passlock import LockBusy, LockUnusable, pass_lock
from reaper.layout import Layout, detect_layout
from reaper.logs import setup_logging
from reaper.model import HostUnseen
from reaper.report import layout_json
from reaper.runtime.liveness import liveness_from
from reaper.settings import (
    Settings,
    SettingsError,
    add_options,
    agent_settings_from,
    given_as,
    reap_settings_from,
    scan_mode_refusal,
    settings_from,
    with_pod_cidrs,
)

if TYPE_CHECKING:
    from reaper.metrics import ReaperMetrics
    from reaper.model import RuntimeView

EXIT_CLEAN = 0
EXIT_ORPHANS = 1
EXIT_UNDECIDED = 2
EXIT_BREAKER = 3
EXIT_LOCKED = 4  # another reaper on this node held the lock for the whole --lock-wait

DESCRIPTION = """\
Find container-network resources that no live pod owns: pinned network namespaces,
host veths, host-local IP leases, libcni cache entries and the iptables/nftables
chains CNI plugins leave, reconciled against the sandboxes the CRI runtime lists.
"""

SCAN_EPILOG = """\
verdicts:
  live     a listed sandbox (READY or NOTREADY) or a process owns it
  orphan   nothing owns it, it is older than --min-age and was seen so on
           --confirmations consecutive passes (counted in --state-file; a pass
           counts only half of --interval, 30s by default, or more after the one
           that last counted, so runs seconds apart count once)
  pending  nothing owns it, but it is too young or not yet confirmed
  unknown  the runtime could not be asked, so nothing is called orphan
  excluded nothing owns it, but --exclude-namespace, --exclude-pod or
           --exclude-network keeps it: never reclaimed
  waiting  an orphan of which only the files a stateful plugin's DEL needs are
           left, and no DEL can run for it: kept, freed with the plugin's own
           tools. A one-shot run (scan, reap) has this for every Calico entry with
           no pin: only the agent (`reaper run`) DELs one, for a sandbox a runtime
           of this node listed to it since it started and lists no more

exit status: 0 no orphan, 1 orphans found, 2 could not decide (runtime or config), 4 another
reaper's pass held the lock beside --state-file for the whole --lock-wait (stderr names it)

examples:
  reaper scan                                   # containerd/CRI-O on their default sockets
  reaper scan --json | jq '.attachments[] | select(.verdict=="orphan")'
  reaper scan --runtime-endpoint unix:///run/k3s/containerd/containerd.sock --min-age 30m
"""


EXPLAIN_EPILOG = """\
exit status: 0 something matched, 1 nothing on this node matches TARGET, 2 could not decide
(runtime or config): the evidence is shown, every verdict is unknown; or TARGET is empty or
shorter than 3 characters, which names nothing (nothing is looked at)

examples:
  reaper explain 3f2a9c                         # a container ID prefix
  reaper explain kube-system/coredns-5d78c9869d-x
  reaper explain 10.244.1.17 --json
  reaper explain veth3c1f2a7b
"""

DOCTOR_EPILOG = """\
checks: every CRI runtime answers (and how many sandboxes it lists); the CNI conf, bin, netns,
cache and IPAM dirs detected or given, and readable here; every plugin of each network's DEL
in the bin dirs, and the daemon sockets some need; the host's PID namespace and netns mount
propagation visible; iptables-save and nft present, and which backends hold CNI rules.

exit status: 0 no check failed, 1 a check failed (the reaper would be blind or unsafe here)

examples:
  reaper doctor
  reaper doctor --json | jq '.checks[] | select(.status != "ok")'
"""


REAP_EPILOG = """\
safety: only attachments the scan calls orphan are touched (see `reaper scan --help`); the
runtime is asked again right before acting and a sandbox that reappeared is left alone;
every delete compares first (a pin still the same namespace with no process inside, a lease
that still names the orphan under the IPAM lock, a veth with the same index, name and peer);
at most --max-reap attachments a pass; the breaker refuses to act when too many look orphaned.
Where REAPER_MODE is scan (a report-only pod), a reap is refused (exit 2) unless --dry-run or
--force is given. Calico leftovers with no pin wait here (see `reaper scan --help`, waiting):
Calico frees by container ID cluster-wide, and only the agent can prove an ID was this node's.

exit status: 0 every orphan reclaimed (or none), 1 some could not be, 2 could not decide
(runtime or config), 3 breaker open, 4 another reaper's pass held the lock beside --state-file
for the whole --lock-wait (stderr names it; nothing was done)

examples:
  reaper reap --dry-run                         # the plan, nothing changed
  reaper reap --dry-run --plan-out plan.json    # the plan, written for review
  reaper reap --plan plan.json                  # reclaim only what was reviewed, if unchanged
  reaper reap --quarantine-dir /var/lib/cni-reaper/quarantine
  reaper reap --json                            # one pass, e.g. from a systemd timer
"""


class _PrintVersion(argparse.Action):
    """`--version`: the installed distribution's version, looked up only when asked."""

    def __call__(self, parser: argparse.ArgumentParser, *_: object) -> None:
        from importlib.metadata import PackageNotFoundError, version  # noqa: PLC0415

        try:
            number = version("cni-reaper")
        except PackageNotFoundError:
            number = "unknown (not installed)"
        _output(f"reaper {number}")  # `reaper --version | false` is no traceback
        parser.exit()


# Flags of the "paths" and "output" groups `doctor` has no check for: given to doctor, they would
# be taken and do nothing, and the operator would believe them checked. Their REAPER_* variables
# are still read (and a bad one is an error), as the agent beside it reads them.
DOCTOR_UNUSED = (
    "--namespaces-dir",
    "--netns-pattern",
    "--min-age",
    "--confirmations",
    "--stuck-after",
    "--exclude-namespace",
    "--exclude-pod",
    "--exclude-network",
    "--state-file",
    "--lock-wait",
    "--textfile",
    "--log-level",
)


# Flags of the "reap" group only a one-shot `reap` takes: an agent reviews nothing.
REAP_ONLY = ("--plan-out", "--plan", "--drop-waiting")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="reaper", description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--version", action=_PrintVersion, nargs=0, help="print the version and exit")
    # Not required here: parse() says what is missing or unknown, with the usage of the command
    # it was typed for (argparse would answer `reaper --bogus` with "COMMAND is required").
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    command = partial(sub.add_parser, formatter_class=argparse.RawDescriptionHelpFormatter)
    scan = command(
        "scan",
        help="report which resources are live, orphaned or pending; changes nothing on the node",
        description="Read-only pass: report which container-network resources are leaked.",
        epilog=SCAN_EPILOG,
    )
    add_options(scan, ("paths", "output"))
    reap = command(
        "reap",
        help="one pass that reclaims every orphan: plugin DEL, then direct kernel cleanup; verified",
        description="Scan, then reclaim what is orphaned: the plugins' DEL the way a runtime should have run "
        "it, then direct cleanup in the kernel for what DEL left; then look again and report what is gone.",
        epilog=REAP_EPILOG,
    )
    add_options(reap, ("paths", "reap", "output"))
    run = command(
        "run",
        help="the node agent: a pass every --interval, Prometheus metrics and health on --listen",
        description="Run passes forever (report-only scans by default, reclaiming with --mode reap), serving "
        "/metrics, /healthz and /readyz. SIGTERM or SIGINT: the step under way finishes, no new one starts, exit 0.",
    )
    add_options(run, ("paths", "reap", "agent"), skip=REAP_ONLY)
    doctor = command(
        "doctor",
        help="check everything the reaper needs on this node: runtimes, dirs, namespaces, plugins",
        description="One line a check: ok, warn or fail, with the fix. Changes nothing.",
        epilog=DOCTOR_EPILOG,
    )
    add_options(doctor, ("paths", "output"), skip=DOCTOR_UNUSED)
    explain = command(
        "explain",
        help="why one container, pod, address, veth or pin got its verdict: every resource and the evidence",
        description="Look at the node as `scan` does (counting no pass of its own) and show, for each "
        "attachment TARGET names, its resources, its verdict and what it rests on: what each runtime "
        "listed, whose namespace it is and who is inside, what earlier passes counted, and what a "
        "reclaim would run.",
        epilog=EXPLAIN_EPILOG,
    )
    explain.add_argument(
        "target",
        metavar="TARGET",
        help="a container ID or a prefix of one (3+ hex digits), a pod NAMESPACE/NAME, an IP address, "
        "or the name or path of a resource (veth, pin, lease, chain, cache file)",
    )
    add_options(explain, ("paths", "output"), skip=("--textfile", "--lock-wait"))
    return parser


def parse(parser: argparse.ArgumentParser, argv: list[str]) -> argparse.Namespace:
    """The command line, or exit 2 with one error that names what was typed: an unknown flag
    with the usage of the command it was given to (`reaper scan --bogus` prints scan's)."""
    args, unknown = parser.parse_known_args(argv)
    command: str | None = args.command
    # What was typed before the command is the top level's (`reaper --bogus scan`).
    before = argv[: argv.index(command)] if command in argv else argv
    if any(u in before for u in unknown):
        parser.error(f"unrecognized arguments: {' '.join(u for u in unknown if u in before)}")
    sub = _subparser(parser, command)
    if unknown and sub is not None:
        unused = [u.partition("=")[0] for u in unknown if u.partition("=")[0] in DOCTOR_UNUSED]
        if command == "doctor" and unused:
            sub.error(f"{unused[0]} is not used by doctor: no check reads it")
        sub.error(f"unrecognized arguments: {' '.join(unknown)}")
    if command is None:
        parser.error("a COMMAND is required: scan, reap, run, doctor or explain")
    return args


def _subparser(parser: argparse.ArgumentParser, command: str | None) -> argparse.ArgumentParser | None:
    # argparse keeps no public handle on its subparsers
    subparsers = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    found: argparse.ArgumentParser | None = subparsers.choices.get(command or "")
    return found


def _start(args: argparse.Namespace, log_level: str | None = None) -> tuple[Settings, Layout, logging.Logger]:
    """The settings (dirs no flag or variable gave detected from the runtimes' configs), those
    configs, and the logger, after one warning for each given dir that is not there."""
    layout = detect_layout(proc="/proc")
    settings = with_pod_cidrs(settings_from(args, layout=layout))
    log = setup_logging(settings.log_format, log_level or settings.log_level)
    for problem in settings.given_problems:  # the JSON's `problems` says them too
        log.warning(problem)
    return settings, layout, log


def _fail(message: str, status: int = EXIT_UNDECIDED) -> int:
    print(f"reaper: {message}", file=sys.stderr)
    return status


def _undecided(problem: str, view: RuntimeView, layout: Layout) -> int:
    """A pass that could not decide: when no runtime answered, its likely cause (the report lists
    each socket tried), else the pass's own problem."""
    if view.reachable:
        return _fail(f"cannot decide: {problem}")
    from reaper.runtime.cause import likely_cause  # noqa: PLC0415

    return _fail(f"cannot decide: runtime unreachable: {likely_cause(view, layout)}")


def _scan(args: argparse.Namespace) -> int:
    from reaper.report import report_json, report_table  # noqa: PLC0415 (see the module's docstring)
    from reaper.scan import scan_pass  # noqa: PLC0415

    settings, layout, log = _start(args)
    if os.geteuid() != 0:
        log.warning("not running as root: namespaces, /proc and iptables may be partly unreadable")
    with pass_lock(settings.state_file, settings.lock_wait, log, changes_node=False):  # counts, counters
        result = scan_pass(settings, liveness_from(settings), log)
        report = result.report
        if settings.textfile is not None:
            from reaper.metrics import ReaperMetrics  # noqa: PLC0415
            from reaper.reap.plan import breaker_would_trip  # noqa: PLC0415

            metrics = ReaperMetrics(mode="scan")
            metrics.observe_scan(report)
            # As the agent in scan mode: whether a reap of this would stop at the breaker, by
            # the ratio a reap here would use (REAPER_MAX_ORPHAN_RATIO, as the reap drop-in sets it).
            metrics.observe_breaker(breaker_would_trip(report, reap_settings_from(args).policy))
            metrics.observe_state(result.state_saved)
            metrics.observe_pass(result.seconds, result.outcome, time.time())
            _write_textfile(settings, metrics, log)
    if settings.json_output:
        _output(dumps_indented({**report_json(report), "layout": layout_json(settings)}))
    else:
        _output(report_table(report))
    if result.problem is not None:
        return _undecided(result.problem, report.runtime, layout)
    return EXIT_ORPHANS if report.count("orphan") else EXIT_CLEAN


def _write_textfile(settings: Settings, metrics: ReaperMetrics, log: logging.Logger) -> None:
    """The metrics for node_exporter's textfile collector, counters summed over every run so
    far: earlier runs' totals are kept in the state file (and start over with it)."""
    from reaper.metrics import TextfileError, cumulative_exposition, write_textfile  # noqa: PLC0415
    from reaper.state import StateError, load_state, save_state  # noqa: PLC0415

    path = settings.textfile
    if path is None:
        return
    state, _ = load_state(settings.state_file)  # the pass just saved it; a warning was its to give
    exposition, totals = cumulative_exposition(metrics.registry, state.counters)
    try:
        write_textfile(path, exposition)
    except TextfileError as err:
        log.error("textfile not written", extra={"path": path, "error": err.strerror})
        return
    try:
        save_state(settings.state_file, replace(state, counters=totals))
    except StateError as err:
        log.warning(f"{err}; the textfile's counters start over next run")


def _run(args: argparse.Namespace) -> int:
    from reaper.agent import Agent  # noqa: PLC0415
    from reaper.events import events_from  # noqa: PLC0415
    from reaper.http import ListenError  # noqa: PLC0415

    settings, _, log = _start(args)
    agent_settings = agent_settings_from(args)
    events = events_from(
        agent_settings.events, settings.node_name, os.environ, log, namespace=agent_settings.events_namespace
    )
    try:
        return Agent(
            settings, reap_settings_from(args), agent_settings, liveness_from(settings), log, events=events
        ).run()
    except ListenError as err:  # before any pass: the endpoints come first
        host, port = agent_settings.listen_host, agent_settings.listen_port
        shown = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        return _fail(f"{given_as('--listen', args) or '--listen'} {shown}: cannot listen: {err}")


def _reap(args: argparse.Namespace) -> int:
    from reaper.host.atomic import write_atomically  # noqa: PLC0415
    from reaper.metrics import ReaperMetrics  # noqa: PLC0415
    from reaper.reap import reap_pass  # noqa: PLC0415
    from reaper.reap.review import PlanError, plan_document, read_plan, this_node  # noqa: PLC0415
    from reaper.reap.run import plan_pass, preview  # noqa: PLC0415
    from reaper.report import reap_json, reap_table  # noqa: PLC0415

    if (refused := scan_mode_refusal(args)) is not None:
        return _fail(refused)
    settings, layout, log = _start(args)
    reap = reap_settings_from(args)
    if os.geteuid() != 0:
        log.warning("not running as root: reclaiming will fail")
    node = this_node()
    reviewed = None
    if reap.plan_out is not None and not reap.dry_run:
        return _fail("--plan-out writes a plan for review: give it with --dry-run")
    if reap.drop_waiting and not reap.dry_run and reap.plan is None:
        return _fail("--drop-waiting acts on a reviewed plan only: give it with --dry-run --plan-out, then with --plan")
    if reap.plan is not None:
        try:
            reviewed = read_plan(reap.plan, node)
        except PlanError as err:
            return _fail(str(err))
    with pass_lock(settings.state_file, settings.lock_wait, log, changes_node=True):  # one DEL at a time
        started = time.monotonic()
        if reap.dry_run:  # the plan as the pass would act on it; nothing is touched
            planned = preview(plan_pass(settings, reap, liveness_from(settings), log, reviewed=reviewed), settings)
            result = planned.result()
            if reap.plan_out is not None and result.problem is None:
                try:
                    document = plan_document(planned.plan, planned.scan.report.attachments, node, time.time())
                    write_atomically(reap.plan_out, document, 0o600)
                except OSError as err:
                    return _fail(f"--plan-out {reap.plan_out}: {err.strerror}")
        else:
            result = reap_pass(settings, reap, liveness_from(settings), log, reviewed=reviewed)
        metrics = ReaperMetrics(mode="scan" if reap.dry_run else "reap")  # a dry run changes nothing
        metrics.observe_reap(result)
        metrics.observe_pass(time.monotonic() - started, result.outcome, time.time())
        _write_textfile(settings, metrics, log)
    if settings.json_output:
        _output(dumps_indented({**reap_json(result), "layout": layout_json(settings)}))
    else:
        _output(reap_table(result, reap.dry_run))
    if result.outcome == "breaker":
        return _fail(str(result.problem), EXIT_BREAKER)
    if result.problem is not None:
        return _undecided(result.problem, result.report.runtime, layout)
    if reap.dry_run:
        return EXIT_ORPHANS if result.plan else EXIT_CLEAN
    return EXIT_CLEAN if all(o.ok for o in result.reclaimed) else EXIT_ORPHANS


def _doctor(args: argparse.Namespace) -> int:
    from reaper.doctor import doctor_json, doctor_table, run_checks  # noqa: PLC0415

    settings, layout, _ = _start(args, "warning")
    setup_logging(settings.log_format, "error")  # the checks say the rest, one line each
    view = liveness_from(settings).observe({})
    checks = run_checks(settings, layout, view, os.environ.get("REAPER_CNI_PRESET"), os.environ.get("REAPER_PLATFORM"))
    if settings.json_output:
        _output(dumps_indented({**doctor_json(checks), "layout": layout_json(settings)}))
    else:
        _output(doctor_table(checks))
    return EXIT_ORPHANS if any(c.status == "fail" for c in checks) else EXIT_CLEAN


def _explain(args: argparse.Namespace) -> int:
    from reaper.explain import explain, explain_json, explain_text, target_problem  # noqa: PLC0415
    from reaper.scan import scan_pass  # noqa: PLC0415
    from reaper.state import load_state  # noqa: PLC0415

    if (problem := target_problem(args.target)) is not None:  # a usage error, before the node is looked at
        raise SettingsError(problem)
    settings, layout, log = _start(args)
    history = load_state(settings.state_file)[0].attachments
    reap = reap_settings_from(args)
    allowed, kernel_only = reap.allow_plugins, reap.policy.kernel_only
    result = scan_pass(
        settings, liveness_from(settings), log, save=False, allow_plugins=allowed, plugins_run=not kernel_only
    )
    confirmations = settings.policy.confirmations
    found = explain(
        result, args.target, history, confirmations, allowed, kernel_only=kernel_only, quarantine=reap.policy.quarantine
    )
    if settings.json_output:
        _output(dumps_indented(explain_json(args.target, found, result.report.taken_at)))
    else:
        _output(explain_text(args.target, found))
    if not result.report.runtime.reachable:
        return _undecided(str(result.report.runtime.error), result.report.runtime, layout)
    return EXIT_CLEAN if found else EXIT_ORPHANS


COMMANDS: dict[str, Callable[[argparse.Namespace], int]] = {
    "scan": _scan,
    "reap": _reap,
    "run": _run,
    "doctor": _doctor,
    "explain": _explain,
}


def main(argv: Sequence[str] | None = None) -> int:
    args = parse(build_parser(), sys.argv[1:] if argv is None else list(argv))  # a COMMAND, or exit 2
    try:
        return COMMANDS[args.command](args)
    except (SettingsError, HostUnseen, LockUnusable) as err:
        return _fail(str(err))
    except LockBusy as err:
        return _fail(str(err), EXIT_LOCKED)
    except KeyboardInterrupt:
        return 130


def _output(text: str | bytes) -> None:
    """The report on stdout (JSON as the bytes it was made as). A reader that went away
    (`reaper scan --json | head`) loses the rest of it, not the exit status: the pass was made
    and its state kept."""
    try:
        if isinstance(text, str):
            sys.stdout.write(text + "\n")
        else:
            sys.stdout.flush()
            sys.stdout.buffer.write(text)
            sys.stdout.buffer.write(b"\n")
        sys.stdout.flush()
    except BrokenPipeError:
        # What is left in the buffer goes nowhere, so the interpreter's flush at exit fails no more.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)


def entry() -> None:
    """The `reaper` command: main(), its exit status the process's."""
    sys.exit(main())


if __name__ == "__main__":
    entry()
