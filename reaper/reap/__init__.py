"""Reclaiming: plan.py decides (pure), act.py does, run.py is one whole pass."""

from reaper.reap.run import reap_pass

__all__ = ["reap_pass"]
