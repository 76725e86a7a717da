"""Every hook a plasmid plugin can implement.

Hooks are for start-up and observation, never for the RL hot path: registration hooks hand the
kernel named provider factories once per process, and the kernel then calls the providers
directly (awaiting the async ones). Implement a hook with the :data:`plasmid.hookimpl` marker in a
module that is listed under the entry-point group ``plasmid``::

    from plasmid import hookimpl

    @hookimpl
    def plasmid_rewards(register):
        register("xyz", "rl_plugin_xyz.reward:XyzReward")

An implementation may accept fewer arguments than the spec declares. Hooks grow by adding
arguments; removed ones are deprecated first.

The ``register`` callables all have the form ``register(name, factory, *, default=False)``
(typed as :class:`plasmid.protocols.Register`):

- ``name`` is how users select the provider (``--reward NAME``); unique within its family
  across all loaded plugins. When two plugins register one name, the first registered keeps
  it (the kernel's plugins register first, then first-party distributions, those listed in
  ``plasmid.plugins.FIRST_PARTY``, then the rest) and the newcomer's provider alone is skipped
  with a warning (an error when that plugin was selected with ``--plugins``).
- ``factory`` is the provider factory (see :mod:`plasmid.protocols`) or a ``"module:attr"``
  string naming it, imported only when the provider is chosen, so heavy dependencies are
  paid for only when used.
- ``default=True`` marks the provider to use when a one-provider family has several candidates
  and no choice was given (the embedded quickstart plugins set it). Two defaults in one family
  are an error.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pluggy

if TYPE_CHECKING:
    from plasmid.config import Config, OptionParser
    from plasmid.protocols import Register
    from plasmid.types import SyncReport

hookspec = pluggy.HookspecMarker("plasmid")

# -------------------------------------------------------------------------------------------------
# Bootstrap hooks: called once per process, before any provider is built.
# -------------------------------------------------------------------------------------------------


@hookspec(historic=True)
def plasmid_addoption(parser: OptionParser) -> None:
    """Declare this plugin's command-line options.

    Called once per process, after plugins are loaded and before the command line is parsed;
    historic, so a plugin registered late still gets the call.

    :param parser: the option parser. Declare typed options with
        ``parser.add_options(MyOptions)`` (a :class:`plasmid.options.Options` class: flags, help
        with the real default, type and range checks, and the typed value the provider reads
        with ``MyOptions.of(config)``); declaring a class another plugin declared too is fine.
        ``parser.getgroup(name).addoption("--flag", ...)`` (argparse keywords) still works for
        options outside that scheme: native arguments of an engine or trainer pass through that
        way, one prefixed option per native field (``--sglang-<field>``).
    """


@hookspec(historic=True)
def plasmid_defaults(config: Config) -> None:
    """Fill defaults that depend on the run, before options are checked (recipes).

    Called once per process after the command line is parsed and provider choices are resolved,
    before any options class is checked and before :func:`plasmid_configure`. Change only what
    the user did not give: ``config.set_default("lr", 5e-4)`` (or test ``config.is_given``).
    Nothing may be written here (the run directory is not checked yet): the quickstart recipe
    only points ``--model`` at ``<run dir>/model``, which its data source builds once start-up
    checks have passed, and sets the learning rate and response length for it.

    :param config: the parsed configuration, with provider choices in ``config.option``.
    """


@hookspec(historic=True)
def plasmid_configure(config: Config) -> None:
    """Validate and derive configuration after the command line is parsed.

    Called once per process, before providers are built, after the defaults hooks and after
    every declared options class passed its checks, so the values seen here are final. Raise
    :class:`plasmid.errors.UsageError` for invalid combinations of options that no single
    options class can check.

    :param config: the parsed configuration; ``MyOptions.of(config)`` reads typed values,
        ``config.option`` holds every option's raw value.
    """


# -------------------------------------------------------------------------------------------------
# Registration hooks: one per provider family, called once per process. Each receives
# ``register(name, factory, *, default=False)``; see the module docstring.
# -------------------------------------------------------------------------------------------------


@hookspec
def plasmid_datasources(register: Register) -> None:
    """Register data sources (prompt providers, chosen with ``--datasource``).

    :param register: ``register(name, factory, *, default=False)``; ``factory(config)``
        returns a :class:`plasmid.protocols.DataSource`.
    """


@hookspec
def plasmid_tokenizers(register: Register) -> None:
    """Register tokenizers (``--tokenizer``): how the rollout side turns text into token ids and
    back, chat templates included.

    :param register: ``register(name, factory, *, default=False)``; ``factory(config)``
        returns a :class:`plasmid.protocols.Tokenizer` (a Hugging Face tokenizer is one).
    """


@hookspec
def plasmid_generators(register: Register) -> None:
    """Register rollout engines (``--engine``).

    :param register: ``register(name, factory, *, default=False)``; ``factory(config)`` returns
        a :class:`plasmid.protocols.RolloutEngine`. (Deprecated: ``kind="generate"`` registers a
        generate function here; use :func:`plasmid_generate_fns`.)
    """


@hookspec
def plasmid_generate_fns(register: Register) -> None:
    """Register generate functions (``--generate``): what turns one prompt sample into finished
    samples (multi-turn conversations, tool use, agents); when none is chosen the kernel's
    single-turn one is used.

    :param register: ``register(name, factory, *, default=False)``; ``factory(config)`` returns
        a :class:`plasmid.protocols.GenerateFn`.
    """


@hookspec
def plasmid_rollouts(register: Register) -> None:
    """Register rollout drivers (``--rollout``), which run one rollout step over the engines.

    :param register: ``register(name, factory, *, default=False)``; ``factory(config)``
        returns a :class:`plasmid.protocols.RolloutDriver`.
    """


@hookspec
def plasmid_rewards(register: Register) -> None:
    """Register reward functions, combined with weights by ``--reward NAME[:WEIGHT]``.

    Where a reward runs: each ``--reward`` gets its own event loop in a daemon thread of its
    own (a *reward worker*, :mod:`plasmid.rewards`), not the rollout's loop; a group is sent
    there in one hop and the samples are scored concurrently on it. What a reward may do:

    - *await* anything (HTTP, subprocesses, ``asyncio.sleep``): many calls run at once. Create
      loop-bound objects (clients, locks, semaphores, queues) lazily, per running loop, not in
      the factory: the factory runs in the main thread, calls run on the worker's loop, and a
      replaced worker (below) is a new loop.
    - *compute or block* (``time.sleep``, a CPU-bound verifier, blocking I/O): allowed, but it
      stalls the other calls of the same reward until it returns; it never stalls rollout or
      the other rewards. Move heavy work off the loop (``asyncio.to_thread``, a process pool)
      to keep calls concurrent.

    ``--reward-timeout`` is measured from when the group is sent, on the caller's loop, so it
    fires even while the reward's loop is blocked: the samples not yet scored fail for that
    reward with "timed out" (counted in ``reward/failed/NAME: timeout``) and their calls are
    cancelled. A worker whose loop has had calls but not run for a second is abandoned: later
    calls go to a fresh worker (``reward/workers_abandoned``). What leaks when a call never
    returns: the abandoned worker's thread and whatever the call holds (its sandbox slot,
    connection, the memory of the samples), until it returns; the thread is a daemon and does
    not delay the process's exit (threads the reward starts itself, such as
    ``asyncio.to_thread``'s, may). At most 8 abandoned workers per reward are kept alive;
    beyond that new calls wait on the stuck one (and time out).

    Inline rewards: a reward whose calls are pure, bounded and synchronous (string compares,
    a regex on the response; no I/O, nothing that can hang) may declare a class attribute
    ``inline = True``. It is then scored on the caller's thread, in the rollout's loop, with no
    worker, no hop and no ``--reward-timeout``: its ``async def __call__`` is run to completion
    without a loop and must return without awaiting (one that awaits fails the sample for that
    reward, like a raise). Values, failures and their reporting are as for any reward. Declare
    it only for work of microseconds: an inline call that blocks stalls rollout.

    A value must be a finite float32 (``|value| <= 3.4e38``), also once weighted and summed
    with the others; anything else, or an exception (``SystemExit`` included), fails the sample
    for that reward, named with the plugin (``--reward-errors``).

    :param register: ``register(name, factory)``; ``factory(config)`` returns a
        :class:`plasmid.protocols.RewardFn`, or a :class:`plasmid.protocols.GroupRewardFn`
        (an object with ``group = True``) that scores a whole group at once.
    """


@hookspec
def plasmid_filters(register: Register) -> None:
    """Register group filters, applied in order by ``--filter NAME`` (zero or more).

    :param register: ``register(name, factory)``; ``factory(config)`` returns a
        :class:`plasmid.protocols.Filter`.
    """


@hookspec
def plasmid_tools(register: Register) -> None:
    """Register tools the policy may call in multi-turn rollouts, chosen with ``--tools NAME``
    (zero or more; the multi-turn generate function offers them to the model).

    :param register: ``register(name, factory)``; ``factory(config)`` returns a
        :class:`plasmid.protocols.Tool` whose ``name`` is the name the model calls.
    """


@hookspec
def plasmid_losses(register: Register) -> None:
    """Register RL algorithms (``--loss``): advantage estimation and policy loss.

    :param register: ``register(name, factory, *, default=False)``; ``factory(config)``
        returns a :class:`plasmid.protocols.Loss`.
    """


@hookspec
def plasmid_trainers(register: Register) -> None:
    """Register training backends (``--trainer``).

    :param register: ``register(name, factory, *, default=False)``;
        ``factory(config, loss)`` returns a :class:`plasmid.protocols.Trainer` that trains
        with ``loss`` (it builds a reference model when ``loss.needs_ref``, a critic when
        ``loss.needs_critic``).
    """


@hookspec
def plasmid_weight_syncs(register: Register) -> None:
    """Register weight transports from trainer to engines (``--weight-sync``).

    :param register: ``register(name, factory, *, default=False)``; ``factory(config)``
        returns a :class:`plasmid.protocols.WeightSync`.
    """


@hookspec
def plasmid_runtimes(register: Register) -> None:
    """Register runtimes (``--runtime``): where providers are built and run (one process, a
    Ray cluster, ...). The kernel's own ``local`` runtime builds everything in this process.

    :param register: ``register(name, factory, *, default=False)``; ``factory(config)``
        returns a :class:`plasmid.protocols.Runtime`.
    """


# -------------------------------------------------------------------------------------------------
# Observer hooks: every implementation is called; return values are ignored. Keep them cheap.
# One that raises switches its plugin's observers off (--observer-errors; PluginManager.observe).
# -------------------------------------------------------------------------------------------------


@hookspec
def plasmid_run_start(config: Config, run_dir: str) -> None:
    """Observe the start of a run (trackers open their files or runs here).

    Called once by ``plasmid train`` (and ``plasmid replay``), in the driver process, after the
    run directory's header is written (``config.json``, ``plugins.lock.json``) and every
    provider is built, before the first step; not called when start-up fails. Every
    :func:`plasmid_run_start` is followed by one :func:`plasmid_run_end`. An implementation that
    raises is a warning, and its plugin's observer hooks (its run-end too) are off for the run;
    with ``--observer-errors fail`` it stops the start-up instead (one line naming the plugin;
    what the start-up wrote is removed), the other plugins' run-end hooks called with that error.

    :param config: the run's final configuration (``config.option``, ``config.to_dict()``).
    :param run_dir: the run directory (as a string); a tracker may write under it.
    """


@hookspec
def plasmid_run_end(run_dir: str, metrics: dict[str, float], error: str | None) -> None:
    """Observe the end of a run that :func:`plasmid_run_start` announced (trackers flush and close).

    Called once, in the driver process, after the loop returned or raised and before the
    engines and the runtime shut down, also when the run failed or was interrupted.
    ``metrics.jsonl`` is complete by then. A failing implementation is reported on one line and
    the others are still called; it never hides the run's own error.

    :param run_dir: the run directory (as a string).
    :param metrics: the last step's metrics (empty when no step finished).
    :param error: ``None`` when the run ended normally (all steps, the data used up, a stop
        signal), else a one-line description of the error that ended it.
    """


@hookspec
def plasmid_metrics(step: int, metrics: dict[str, float]) -> None:
    """Observe the metrics of one step (loggers, trackers).

    Called in the driver process once per step, by the loop before the step's line is written to
    ``metrics.jsonl`` (a step's evaluation metrics are among them), and by ``plasmid rollout``.

    :param step: the rollout id the metrics belong to.
    :param metrics: flat ``name -> value`` (``rollout/reward_mean``, ``train/loss``, ...).
    """


@hookspec
def plasmid_step_end(step: int, run_dir: str, metrics: dict[str, Any]) -> None:
    """Observe the end of one RL step, after metrics are written and checkpoints saved.

    Called by the loop in the driver process once per step, after :func:`plasmid_metrics`.

    :param step: the rollout id that just finished.
    :param run_dir: the run directory (``metrics.jsonl``, checkpoints live there).
    :param metrics: the step's metrics, as written to ``metrics.jsonl``.
    """


@hookspec
def plasmid_weights_synced(step: int, report: SyncReport) -> None:
    """Observe a finished weight sync (profilers, bandwidth monitors).

    Called by the loop in the driver process after each step's sync (every
    ``--update-weights-interval`` steps), before that step's :func:`plasmid_metrics`.

    :param step: the rollout id whose training produced the weights.
    :param report: bytes moved, seconds taken, and the new weight version.
    """
