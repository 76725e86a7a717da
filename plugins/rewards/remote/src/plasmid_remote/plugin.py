"""Hook implementations of plasmid-remote."""

from __future__ import annotations

from plasmid import hookimpl
from plasmid.errors import UsageError


@hookimpl
def plasmid_addoption(parser):
    group = parser.getgroup("remote", "the 'remote' reward: a reward model or verifier behind HTTP")
    group.addoption("--rm-url", default=None, help="URL that scores samples (POST, JSON)")
    group.addoption("--rm-timeout", type=float, default=30.0, help="seconds one request may take")
    group.addoption("--rm-retries", type=int, default=3, help="retries after a connection error or 5xx answer")
    group.addoption("--rm-backoff", type=float, default=0.5, help="first retry delay in seconds; doubles each time")
    group.addoption("--rm-concurrency", type=int, default=8, help="requests in flight at once")
    group.addoption("--rm-batch-size", type=int, default=1,
                    help="send up to N samples per request (as a JSON list; 1: one object per request)")
    group.addoption("--rm-batch-window", type=float, default=0.01,
                    help="seconds to wait for more samples before sending a partial batch")
    group.addoption("--rm-token-env", default=None, metavar="NAME",
                    help="environment variable holding a bearer token for the Authorization header")


@hookimpl
def plasmid_configure(config):
    option = config.option
    for name in ("rm_timeout", "rm_concurrency", "rm_batch_size"):
        if getattr(option, name, 1) <= 0:
            raise UsageError(f"--{name.replace('_', '-')} must be > 0")
    if getattr(option, "rm_retries", 0) < 0 or getattr(option, "rm_backoff", 0) < 0:
        raise UsageError("--rm-retries and --rm-backoff must be >= 0")


@hookimpl
def plasmid_rewards(register):
    register("remote", "plasmid_remote.reward:RemoteReward")
