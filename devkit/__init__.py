"""keel's development harness: what tests, benchmarks and ``make run`` share.

Not shipped (it is not one of the packages ``pyproject.toml`` installs): ``make install``
puts the checkout on the virtualenv's path so ``import devkit`` works from the tests,
``bench/`` and ``deploy/localcloud.py``.

* :mod:`devkit.processes` — a group of keel processes: start, log tail, SIGTERM then
  SIGKILL after a bounded wait, start again under the same name;
* :mod:`devkit.environment` — the ``KEEL_*`` environment a cloud's processes share;
* :mod:`devkit.database` — scratch databases copied from one migrated template, and
  what crashed runs left behind;
* :mod:`devkit.broker` — the test broker: waiting for it, removing an exchange and its
  queues;
* :mod:`devkit.readiness` — bounded waits, free ports, "is the API up", "which services
  are up";
* :mod:`devkit.prerequisites` — the servers and plugins ``make run`` and ``make test``
  need, each missing one named in one line with the command that fixes it.
"""

from __future__ import annotations

import uuid
from pathlib import Path

#: The top of the checkout.
ROOT = Path(__file__).resolve().parents[1]

#: The image every harness registers as ``cirros``.
CIRROS_ID = uuid.UUID("c1770500-0000-4000-8000-00000000c105")
