"""The plasmid-serving tests import their test support (``serving_fakes``: a fake server and
engine) from this directory."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
