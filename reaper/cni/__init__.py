"""CNI plugins: what to send them (requests.py) and how to run them (invoke.py)."""
