"""Hook implementations of plasmid-code."""

from __future__ import annotations

from plasmid import hookimpl
from plasmid.errors import UsageError


@hookimpl
def plasmid_addoption(parser):
    group = parser.getgroup("code", "the 'code' reward: tests run in a sandbox")
    group.addoption("--code-timeout", type=float, default=5.0, help="wall-clock seconds per test run")
    group.addoption("--code-memory-mb", type=int, default=512, help="address-space limit of each sandbox process")
    group.addoption("--code-processes", type=int, default=16,
                    help="processes the sandbox user may have at once (bounds fork bombs)")
    group.addoption("--code-max-output-kb", type=int, default=1024, help="stdout kept per run; more fails the run")
    group.addoption("--code-concurrency", type=int, default=2, help="sandboxed runs at once (per process)")
    group.addoption("--code-python", default=None,
                    help="Python that runs the code; the sandbox user must be able to execute it "
                         "(default: this one, else /usr/bin/python3)")
    group.addoption("--code-sandbox-uid", type=int, default=61000,
                    help="first of --code-concurrency uids the sandbox runs as when plasmid runs as root; "
                         "they must belong to no user")


@hookimpl
def plasmid_configure(config):
    option = config.option
    for name in ("code_timeout", "code_memory_mb", "code_processes", "code_max_output_kb", "code_concurrency"):
        if getattr(option, name, 1) <= 0:
            raise UsageError(f"--{name.replace('_', '-')} must be > 0, got {getattr(option, name)}")


@hookimpl
def plasmid_rewards(register):
    register("code", "plasmid_code.reward:CodeReward")
