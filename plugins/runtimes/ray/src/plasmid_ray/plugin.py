"""Hook implementations of plasmid-ray: the ``ray`` runtime and its options (Ray is imported only
when the runtime is chosen)."""

from __future__ import annotations

from plasmid import hookimpl
from plasmid.config import OptionParser
from plasmid_ray.options import RayOptions


@hookimpl
def plasmid_addoption(parser: OptionParser) -> None:
    parser.add_options(RayOptions)


@hookimpl
def plasmid_runtimes(register):
    register("ray", "plasmid_ray.runtime:RayRuntime")
