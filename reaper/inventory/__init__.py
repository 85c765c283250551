"""One collector per kind of resource on the node; each returns immutable records."""
