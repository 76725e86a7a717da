"""Hook implementations of plasmid-torchgen: the ``torchgen`` engine and its option."""

from __future__ import annotations

from plasmid import hookimpl
from plasmid.errors import UsageError


@hookimpl
def plasmid_addoption(parser):
    group = parser.getgroup("torchgen", "the embedded PyTorch rollout engine")
    group.addoption("--torchgen-max-batch-size", type=int, default=1024,
                    help="most requests decoded together; later ones wait and join as rows finish (default 1024)")


@hookimpl
def plasmid_configure(config):
    if config.getoption("torchgen_max_batch_size", 1) < 1:
        raise UsageError("--torchgen-max-batch-size must be >= 1 (plugin torchgen)")


@hookimpl
def plasmid_generators(register):
    register("torchgen", "plasmid_torchgen.engine:TorchEngine", kind="engine", default=True)
