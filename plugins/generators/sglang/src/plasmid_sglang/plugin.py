"""Hook implementations of plasmid-sglang: the ``sglang`` engine, its weight syncs, its options.

Neither torch nor sglang is imported here: providers are ``"module:attr"`` strings and the
``--sglang-<ServerArgs field>`` options are read from SGLang's source (:mod:`plasmid_sglang.native`).
"""

from __future__ import annotations

from plasmid import hookimpl
from plasmid.errors import UsageError
from plasmid.native_options import add_options
from plasmid_sglang.native import PLASMID_DEFAULTS, native_fields
from plasmid_sglang.server import parse_env

POSITIVE = ("sglang_servers", "sglang_max_concurrency", "sglang_startup_timeout", "sglang_request_timeout",
            "sglang_flush_timeout", "sglang_update_timeout")


@hookimpl
def plasmid_addoption(parser):
    group = parser.getgroup("sglang", "SGLang servers as the rollout engine (--engine sglang)")
    group.addoption("--sglang-external-addrs", default=None, metavar="HOST:PORT,...",
                    help="attach to these running SGLang servers instead of launching any (one engine fronts "
                         "them all and balances requests; use --engines 1)")
    group.addoption("--sglang-servers", type=int, default=1,
                    help="servers each engine launches on --model; requests go to the least loaded (default 1)")
    group.addoption("--sglang-server-env", action="append", default=None, metavar="KEY=VALUE",
                    help="environment variable for launched servers, repeatable (CUDA_VISIBLE_DEVICES=1, ...)")
    group.addoption("--sglang-log-dir", default=None, help="server logs (default: <run dir>/sglang)")
    group.addoption("--sglang-startup-timeout", type=float, default=900.0,
                    help="seconds a launched server may take to become healthy (default 900)")
    group.addoption("--sglang-max-concurrency", type=int, default=512,
                    help="requests in flight per server; more wait in this process (default 512)")
    group.addoption("--sglang-request-timeout", type=float, default=3600.0,
                    help="seconds one /generate request may take (default 3600)")
    group.addoption("--sglang-request-retries", type=int, default=3,
                    help="times a request is sent again after its server stopped answering (default 3)")
    group.addoption("--sglang-flush-timeout", type=float, default=60.0,
                    help="seconds flush_cache retries while requests still run before it fails (default 60)")
    group.addoption("--sglang-health-interval", type=float, default=10.0,
                    help="seconds between health checks of each server; 0 turns the monitor off (default 10)")
    group.addoption("--sglang-max-restarts", type=int, default=3,
                    help="restarts of a dead launched server before it is out of service; 0 also keeps no copy "
                         "of the weights for restoring (default 3)")
    group.addoption("--sglang-tensor-transport", default="auto", choices=["auto", "pickle", "cuda-ipc"],
                    help="how tensor updates reach servers: the bytes in the request (pickle), or CUDA IPC "
                         "handles for a server on the same GPU host (auto: cuda-ipc for GPU tensors)")
    group.addoption("--sglang-update-backend", default="auto", choices=["auto", "gloo", "nccl"],
                    help="torch.distributed backend of --weight-sync sglang-distributed (auto: nccl when the "
                         "trainer sees a GPU, else gloo)")
    group.addoption("--sglang-router", action="store_true",
                    help="front the servers with an SGLang router (package sglang-router); without it the engine "
                         "sends each request to its least loaded server")
    group.addoption("--sglang-router-policy", default="cache_aware",
                    choices=["cache_aware", "round_robin", "random", "power_of_two"],
                    help="the router's policy (default cache_aware: a shared prefix goes where it is cached)")
    group.addoption("--sglang-router-arg", action="append", default=None, metavar="ARG",
                    help="extra argument for sglang_router.launch_router, repeatable "
                         "(--sglang-router-arg=--queue-size=256)")
    group.addoption("--sglang-update-timeout", type=float, default=600.0,
                    help="seconds the distributed weight-update group waits for its members (default 600)")

    native = parser.getgroup("sglang native", "SGLang ServerArgs fields, generated from the installed version; "
                             "unset means SGLang's default, or plasmid's for: "
                             + "; ".join(f"{name} ({why})" for name, why in PLASMID_DEFAULTS.items()))
    add_options(native, native_fields())


@hookimpl
def plasmid_configure(config):
    option = config.option
    for name in POSITIVE:
        if getattr(option, name, 1) <= 0:
            raise UsageError(f"--{name.replace('_', '-')} must be > 0 (plugin sglang)")
    for name in ("sglang_request_retries", "sglang_max_restarts"):
        if getattr(option, name, 0) < 0:
            raise UsageError(f"--{name.replace('_', '-')} must be >= 0 (plugin sglang)")
    if getattr(option, "sglang_health_interval", 0) < 0:
        raise UsageError("--sglang-health-interval must be >= 0 (0 turns the monitor off; plugin sglang)")
    parse_env(getattr(option, "sglang_server_env", None))
    if getattr(option, "engine", None) == "sglang" and getattr(option, "sglang_external_addrs", None) \
            and getattr(option, "engines", 1) != 1:
        raise UsageError("--sglang-external-addrs gives every server to one engine, which balances requests over "
                         "them; use --engines 1 with it (plugin sglang)")


@hookimpl
def plasmid_generators(register):
    register("sglang", "plasmid_sglang.engine:SGLangEngine", kind="engine")


@hookimpl
def plasmid_weight_syncs(register):
    register("sglang-tensor", "plasmid_sglang.syncs:TensorSync")
    register("sglang-distributed", "plasmid_sglang.syncs:DistributedSync")
    register("sglang-disk", "plasmid_torch.disk_sync:DiskSync")  # uses the engine's /update_weights_from_disk
