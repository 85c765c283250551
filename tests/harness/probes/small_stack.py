"""The plugin exec under a stack limit of 256 KiB, so that the kernel allows argv and env only
its floor of ARG_MAX (max(stack / 4, 32 pages)). Usage: small_stack BIN_DIR PAD: runs BIN_DIR's
echo-args plugin with CNI_ARGS padded by PAD bytes and a netns path of PATH_MAX (prints what
it answered, as JSON), then with a 200 kB value (prints the one-line failure)."""

from __future__ import annotations

import json
import resource
import sys

from msgspec.structs import replace

from reaper.cni.invoke import PluginEnv, PluginFailure, run_plugin
from reaper.cni.requests import cni_args_of

SMALL_STACK = 256 << 10


def main(bin_dir: str, pad: int) -> None:
    resource.setrlimit(resource.RLIMIT_STACK, (SMALL_STACK, resource.getrlimit(resource.RLIMIT_STACK)[1]))
    args = cni_args_of([["K8S_POD_NAMESPACE", "default"], ["K8S_POD_NAME", "web-0"], ["K", "v" * pad]])
    env = PluginEnv(
        command="DEL",
        container_id="c" * 64,
        netns="/" + "n" * 4094,
        ifname="eth0",
        args=args,
        bin_dirs=(bin_dir,),
    )
    print(json.dumps(run_plugin("echo-args", {}, env, timeout=30)))
    try:
        run_plugin("echo-args", {}, replace(env, args=(("K", "v" * 200_000),)), timeout=30)
    except PluginFailure as err:
        print(err)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
