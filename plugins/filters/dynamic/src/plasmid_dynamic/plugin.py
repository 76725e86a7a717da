"""Hook implementations of plasmid-dynamic."""

from __future__ import annotations

from plasmid import hookimpl

DEFAULT_TOLERANCE = 1e-8


@hookimpl
def plasmid_addoption(parser):
    group = parser.getgroup("dynamic", "dynamic sampling filter (--filter zero-std)")
    group.addoption("--zero-std-tolerance", type=float, default=DEFAULT_TOLERANCE,
                    help="zero-std drops a group when its highest and lowest rewards differ by at most this")


@hookimpl
def plasmid_filters(register):
    register("zero-std", "plasmid_dynamic.zero_std:ZeroStdFilter")
