"""The options of the ``zero-std`` filter, declared once: flags, help, checks and typed values."""

from __future__ import annotations

from plasmid.options import Options, option


class ZeroStdOptions(Options, group="dynamic", description="dynamic sampling filter (--filter zero-std)"):
    zero_std_tolerance: float = option(1e-8, "zero-std drops a group when its highest and lowest rewards differ by "
                                             "at most this", min=0)
