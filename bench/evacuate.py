"""Evacuation: a host with K instances evacuated; time until all are ACTIVE elsewhere.

Targets: 500 instances all ACTIVE within 60 s; the returning source host confirms every
evacuation record within 10 s. keel cannot evacuate yet (no evacuate API, workflow or
migration records), so this benchmark only says so; it will measure once evacuation
exists.
"""

from __future__ import annotations

import sys

from benchkit import not_available


def main() -> int:
    not_available("evacuate", "keel has no evacuation yet (API, conductor task, migrations)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
