"""cni-reaper: finds and reclaims the container-network resources no live pod owns."""
