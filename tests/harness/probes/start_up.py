"""Start-up as the agent and every command make it: the settings, then the pod CIDRs. Usage:
start_up ENV_JSON (the environment the settings read). Prints whether the pod CIDRs were
learnt and the layout problems, as JSON. A process of its own, so that a lookup that never
returns fails the test instead of hanging it."""

from __future__ import annotations

import json
import sys

from reaper.cli import build_parser
from reaper.settings import settings_from, with_pod_cidrs


def main(env: dict[str, str]) -> None:
    settings = with_pod_cidrs(settings_from(build_parser().parse_args(["scan"]), env), env)
    print(json.dumps({"pod_cidrs": settings.find.pod_cidrs is not None, "problems": settings.layout_problems}))


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))
