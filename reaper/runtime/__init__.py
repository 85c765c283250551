"""What the container runtimes say is alive: the CRI client and the liveness sources."""
