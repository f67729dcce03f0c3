"""The benchmarks' harness (``bench/benchkit``) is importable here as it is from bench/."""

from __future__ import annotations

import sys

from devkit import ROOT

sys.path.insert(0, str(ROOT / "bench"))
