"""Ways of reclaiming an orphan: the plugins' own DEL, direct kernel cleanup, the CNI GC verb."""
