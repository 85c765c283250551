"""One HTTP GET, from wherever it runs (the lab's netns: the agent and Prometheus listen on its
loopback). Usage: http_get URL TIMEOUT. Prints the status on the first line, then the body; an
error status with its body; 0 and the error when no answer came (refused, timed out)."""

from __future__ import annotations

import sys
import urllib.error
import urllib.request


def main(url: str, timeout: float) -> None:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as answer:
            status, body = answer.status, answer.read().decode()
    except urllib.error.HTTPError as err:
        status, body = err.code, err.read().decode()
    except OSError as err:
        status, body = 0, str(err)
    print(status)
    print(body, end="")


if __name__ == "__main__":
    main(sys.argv[1], float(sys.argv[2]))
