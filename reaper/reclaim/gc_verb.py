"""The CNI 1.1 GC verb, opt-in: tell each plugin which attachments are still valid.

Never a substitute for reclaiming each orphan: the reference plugins answer GC with success
and clean nothing.
"""

from __future__ import annotations

from reaper.inventory.netconf import collect_configs
from reaper.model import GcOutcome
from reaper.reclaim.plugin_del import DelConfigError, plugin_list
from reaper.reclaim.plugin_exec import PluginEnv, PluginFailure, run_plugin


def _at_least_1_1(version: str) -> bool:
    try:
        return tuple(int(p) for p in version.split(".")) >= (1, 1, 0)
    except ValueError:
        return False


def gc_networks(
    conf_dir: str, live: list[tuple[str, str, str]], bin_dirs: tuple[str, ...], timeout: float
) -> tuple[GcOutcome, ...]:
    """GC every network of the conf dir that speaks CNI >= 1.1.0 and does not disable it.

    `live` holds (network, container ID, ifname) of every attachment not being reclaimed.
    """
    configs, _ = collect_configs(conf_dir)
    outcomes = []
    for config in configs:
        if config.disable_gc or not _at_least_1_1(config.cni_version):
            continue
        try:
            name, version, plugins = plugin_list(config.raw)
        except DelConfigError as err:
            outcomes.append(GcOutcome(config.name, "(config)", False, str(err)))
            continue
        valid = [{"containerID": cid, "ifname": ifname} for net, cid, ifname in live if net == name]
        env = PluginEnv("GC", "", "", "", (), bin_dirs)
        for plugin in plugins:
            conf = dict(plugin)
            conf.update({"name": name, "cniVersion": version})
            conf["cni.dev/valid-attachments"] = valid
            conf["cni.dev/attachments"] = valid
            plugin_type = str(plugin["type"])
            try:
                run_plugin(plugin_type, conf, env, timeout)
            except PluginFailure as err:
                outcomes.append(GcOutcome(name, plugin_type, False, str(err)))
            else:
                outcomes.append(GcOutcome(name, plugin_type, True, None))
    return tuple(outcomes)
