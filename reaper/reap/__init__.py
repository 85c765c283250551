"""Reclaiming: plan.py (pure) and requests.py decide, act.py does, run.py sequences a pass
(plan_pass returns one Planned value, act_on acts on it)."""

from reaper.reap.run import reap_pass

__all__ = ["reap_pass"]
