"""``plasmid train``: check everything, then write, build, loop and shut down.

The order is what makes a failed start-up leave nothing behind:

1. :func:`plasmid.startup.start`: plugins, options, provider choices, recipes (which only name
   what they need), configure hooks, the run's own checks; nothing is built or written.
2. :func:`plasmid.app.rundir.check_run_dir`: the run directory is writable, holds no other run, and
   a ``--resume`` can continue it.
3. :func:`plasmid.session.build_inputs`: the tokenizer and the data source, built in this process,
   which checks the model directory and every row of the data.
4. Under :class:`plasmid.app.rundir.StartupWrites` (a failure removes what was written):
   :func:`plasmid.session.prepare` (the recipe's tiny model; the inputs that needed it are built
   right after), the runtime's session (engines, trainer), the header (``config.json``,
   ``plugins.lock.json``), then the observers' :func:`~plasmid.hookspecs.plasmid_run_start`
   (:func:`announce`).
5. The loop, then (whatever the loop did) :func:`~plasmid.hookspecs.plasmid_run_end` and the
   session's shutdown.

``--save-rollouts DIR`` saves every step's batch (:mod:`plasmid.app.rollout_store`).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any, TextIO

from plasmid import loop
from plasmid.app.collector import quiet_start_up
from plasmid.app.console import LibraryLogs, Phase, ReportingDriver, report_checkpoints
from plasmid.app.rollout_store import saving
from plasmid.app.rundir import StartupWrites, check_run_dir, write_header
from plasmid.app.runlog import RunLog
from plasmid.app.start import start
from plasmid.app.summary import add_train_options, describe_plugins, verbose
from plasmid.config import Config
from plasmid.errors import PluginError
from plasmid.kernel_options import EvalOptions, GeneralOptions, ProfileOptions, RolloutOptions
from plasmid.plugins import PluginManager
from plasmid.session import Session, build_inputs, instantiate, prepare
from plasmid.startup import Startup


async def start_session(startup: Startup, logs: LibraryLogs | None = None) -> Session:
    """Steps 2 to 4 of the module's order: the run directory checked, the inputs built, then
    (removed again if anything fails) the run's log file (``logs``, started once the run directory
    may be written), the recipe's files, the runtime's session and the header. Each of these
    phases that lasts over a second says so (:class:`~plasmid.app.console.Phase`)."""
    config = startup.config
    check_run_dir(config)
    model = GeneralOptions.of(config).model
    if model is None or Path(model).exists():  # else a recipe names a model that prepare creates
        with Phase("loading the tokenizer and checking the data"):
            build_inputs(startup)
    print(f"run directory: {config.run_dir}", file=sys.stderr)
    with StartupWrites(Path(config.run_dir)):
        if logs is not None:
            logs.start()
        with Phase(f"preparing data source '{config.option.datasource}' (a recipe's model and warm start)"):
            prepare(config, startup.registry)
        with Phase("loading the tokenizer and checking the data"):
            build_inputs(startup)
        runtime = instantiate(startup.registry.get("runtime", config.option.runtime), config)
        with Phase("starting the trainer and engines (loading the model, warming up)"):
            session: Session = await runtime.start(startup)
        if logs is not None:
            logs.detach()  # a library imported while the session started may have set up its logging
        try:
            write_header(config)
        except BaseException:
            await session.shutdown()
            raise
        await announce(session)
    return session


async def announce(session: Session) -> None:
    """The last step of a start-up, inside its :class:`~plasmid.app.rundir.StartupWrites`:
    :func:`notify_run_start`; when that fails (``--observer-errors fail``) the run-end observers
    hear of it, the session is shut down and the error goes on (the guard then removes the
    header and whatever else the start-up wrote)."""
    try:
        notify_run_start(session.startup.manager, session.config)
    except BaseException as exc:
        notify_run_end(session.startup.manager, session.config, {}, (str(exc).splitlines() or [""])[0])
        await session.shutdown()
        raise


def _observers(manager: PluginManager, hook: str) -> list[tuple[str, Any]]:
    return [(impl.plugin_name, impl) for impl in getattr(manager.pm.hook, hook).get_hookimpls()]


def notify_run_start(manager: PluginManager, config: Config) -> None:
    """Call every :func:`~plasmid.hookspecs.plasmid_run_start` (:meth:`PluginManager.observe`):
    one that raises is a warning and its plugin's observers are off for the run, or, with
    ``--observer-errors fail``, a :class:`PluginError` naming it once every other was called."""
    manager.observe("plasmid_run_start", config=config, run_dir=str(config.run_dir))
    if manager.observer_failure:
        raise PluginError(f"{manager.observer_failure}; what the start-up wrote is removed (--observer-errors warn "
                          f"goes on without the plugin's observers)")


def notify_run_end(manager: PluginManager, config: Config, metrics: dict[str, float], error: str | None,
                   stream: TextIO | None = None) -> None:
    """Call every :func:`~plasmid.hookspecs.plasmid_run_end` but those of plugins whose observers
    were switched off, each even when another raised; a failure is one warning line naming the
    plugin, never an error of the run (whatever ``--observer-errors`` says)."""
    values = {"run_dir": str(config.run_dir), "metrics": metrics, "error": error}
    for plugin, impl in reversed(_observers(manager, "plasmid_run_end")):
        if plugin in manager.switched_off:
            continue
        try:
            impl.function(**{name: values[name] for name in impl.argnames})
        except Exception as exc:  # noqa: BLE001 - an observer never hides the run's own outcome
            (stream or sys.stderr).write(f"plasmid: warning: plugin '{plugin}' failed in plasmid_run_end: "
                                         f"{type(exc).__name__}: {exc}\n")


async def observed_train(session: Session, log: RunLog) -> dict[str, float]:
    """:func:`plasmid.loop.train`, then the run-end observer hooks, called in every case with the
    error that ended the run, if any (the run-start ones were called by :func:`announce`)."""
    manager, config = session.startup.manager, session.config
    metrics: dict[str, float] = {}
    error: str | None = None
    try:
        metrics = await loop.train(session, log)
    except BaseException as exc:
        error = (str(exc).splitlines() or [""])[0] or type(exc).__name__
        raise
    finally:
        notify_run_end(manager, config, metrics or log.last_metrics(), error)
    return metrics


def warn_missing_trace(config: Config, stream: TextIO | None = None) -> None:
    """One warning line when ``--profile-step N`` was asked for and ``<run dir>/profile/`` holds no
    trace of step N: the trace is a plugin's work (plasmid-torchtrain), and the run may have
    stopped (or resumed) before that step."""
    step = ProfileOptions.of(config).profile_step
    if step is None or any((Path(config.run_dir) / "profile").glob(f"step_{step}.*")):
        return
    (stream or sys.stderr).write(f"plasmid: warning: --profile-step {step}: no trace was written to "
                                 f"{Path(config.run_dir) / 'profile'} (the run did not reach step {step}, or no "
                                 f"loaded plugin writes traces: plasmid-torchtrain does)\n")


async def run_training(argv: list[str]) -> dict[str, float]:
    # the collector seldom walks start-up's objects; the loop freezes them (plasmid.app.collector)
    with quiet_start_up():
        startup = start(argv, add_options=add_train_options)
        config = startup.config
        print(describe_plugins(startup), file=sys.stderr)
        with LibraryLogs(Path(config.run_dir), show_all=verbose(config) or GeneralOptions.of(config).debug) as logs:
            session = await start_session(startup, logs)
            log = RunLog(config.run_dir, RolloutOptions.of(config).num_rollouts,
                         plot_every=max(1, EvalOptions.of(config).eval_interval or 10))
            try:
                session.driver = ReportingDriver(saving(session.driver, config), log.note)
                report_checkpoints(session.trainer, log.note)
                metrics = await observed_train(session, log)
            finally:
                log.close()
                with Phase("shutting down the engines and trainer"):
                    await session.shutdown()
    warn_missing_trace(config)
    summary = {k: v for k, v in metrics.items() if k.startswith(("eval/", "rollout/reward_mean"))}
    print("final: " + json.dumps(summary), file=sys.stderr)
    return metrics
