"""The options of the ``remote`` reward, declared once: flags, help, checks and typed values."""

from __future__ import annotations

from plasmid.options import Options, option


class RemoteOptions(Options, group="remote", description="the 'remote' reward: a reward model or verifier behind HTTP"):
    rm_url: str | None = option(None, "URL that scores samples (POST, JSON)")
    rm_timeout: float = option(30.0, "seconds one request may take in all (connecting, sending and reading "
                                       "the whole answer)", gt=0)
    rm_retries: int = option(3, "retries after a connection error or 5xx answer", min=0)
    rm_backoff: float = option(0.5, "first retry delay in seconds; doubles each time", min=0)
    rm_concurrency: int = option(8, "requests in flight at once", min=1)
    rm_batch_size: int = option(1, "send up to N samples per request (as a JSON list; 1: one object per request)",
                                min=1)
    rm_batch_window: float = option(0.01, "seconds to wait for more samples before sending a partial batch", min=0)
    rm_token_env: str | None = option(None, "environment variable holding a bearer token for the Authorization "
                                            "header", metavar="NAME")
