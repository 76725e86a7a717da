"""zero-std keeps the filter contract."""

from __future__ import annotations

import plasmid_dynamic.plugin

from plasmid.testing import FilterContract


class TestZeroStdContract(FilterContract):
    plugin = plasmid_dynamic.plugin
    provider = "zero-std"


class TestZeroStdWithToleranceContract(FilterContract):
    plugin = plasmid_dynamic.plugin
    provider = "zero-std"
    config_options = {"zero_std_tolerance": 0.3}
