"""Backfill: online data migration rows/s over 1,000,000 release-1 instance rows.

Target: at least 100,000 rows/s. keel has no online data migrations yet
(``keel-manage db online-data-migrations`` does not exist), so this benchmark only says
so; it will measure once they exist.
"""

from __future__ import annotations

import sys

from benchkit import not_available


def main() -> int:
    not_available("backfill", "keel has no online data migrations yet")
    return 0


if __name__ == "__main__":
    sys.exit(main())
