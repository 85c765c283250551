"""Touching the node with no CNI knowledge: files, netlink, processes, commands, the memo."""
