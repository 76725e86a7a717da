"""The kernel's own options: provider choices, the loop's schedule, and the settings every
trainer, loss and rollout driver share (so that plugins of one family read the same flags).

Values that depend on the task or model default to ``None``; plugins may fill them in
``plasmid_configure`` (the quickstart recipe does), and the kernel's own ``plasmid_configure``
runs last and fills what is still unset with the generic defaults in :data:`FALLBACKS`.
"""

from __future__ import annotations

import os
from datetime import datetime
from pathlib import Path

from plasmid import hookimpl
from plasmid.config import Config, OptionParser
from plasmid.errors import UsageError

#: Generic defaults for options left ``None`` by the user and by every plugin.
FALLBACKS = {
    "lr": 1e-6,
    "max_new_tokens": 64,
}


def reward_spec(text: str) -> tuple[str, float]:
    """Parse ``NAME`` or ``NAME:WEIGHT`` (``--reward format:0.1``)."""
    name, _, weight = text.partition(":")
    if not name:
        raise UsageError(f"--reward {text!r}: expected NAME or NAME:WEIGHT")
    try:
        return name, float(weight) if weight else 1.0
    except ValueError:
        raise UsageError(f"--reward {text!r}: the weight after ':' must be a number") from None


@hookimpl
def plasmid_addoption(parser: OptionParser) -> None:
    general = parser.getgroup("general")
    general.addoption("--plugins", default=None, help="plugins to load: a,b | no:a | ./file.py | pkg.module "
                      "(default: every installed plugin; env PLASMID_PLUGINS)")
    general.addoption("--debug", action="store_true", help="show tracebacks of plugin and provider errors")
    general.addoption("--seed", type=int, default=0, help="seed of every random generator")
    general.addoption("--model", default=None, help="local Hugging Face model directory (default: the "
                      "datasource's recipe, e.g. the quickstart's tiny model)")
    general.addoption("--run-dir", default=None, help="run directory (default: runs/<timestamp>)")
    general.addoption("--resume", action="store_true", help="continue from the newest complete checkpoint in --run-dir")

    choose = parser.getgroup("providers", "which plugin provides each part of the loop")
    choose.addoption("--datasource", default=None, help="prompt source")
    choose.addoption("--engine", default=None, help="rollout engine")
    choose.addoption("--generate", default=None, help="generate function (default: single-turn)")
    choose.addoption("--rollout", default=None, help="rollout driver")
    choose.addoption("--trainer", default=None, help="training backend")
    choose.addoption("--weight-sync", default=None, help="weight transport from trainer to engines")
    choose.addoption("--loss", default=None, help="RL algorithm")
    choose.addoption("--runtime", default=None, help="where providers run (default: local, this process)")
    choose.addoption("--reward", action="append", default=None, metavar="NAME[:WEIGHT]",
                     help="reward function, repeatable; components are summed with their weights")
    choose.addoption("--filter", action="append", default=[], metavar="NAME", help="group filter, repeatable, in order")

    rollout = parser.getgroup("rollout")
    rollout.addoption("--num-rollouts", type=int, default=500, help="RL steps to run")
    rollout.addoption("--prompts-per-step", type=int, default=32, help="prompt groups trained on per step")
    rollout.addoption("--n-samples-per-prompt", type=int, default=8, help="responses sampled per prompt")
    rollout.addoption("--over-sampling", type=float, default=1.0,
                      help="groups started per step, as a multiple of --prompts-per-step (filters may drop some)")
    rollout.addoption("--temperature", type=float, default=1.0)
    rollout.addoption("--top-p", type=float, default=1.0)
    rollout.addoption("--top-k", type=int, default=0, help="0 disables")
    rollout.addoption("--max-new-tokens", type=int, default=None, help="response length limit (tokens)")
    rollout.addoption("--reward-key", default=None, help="pick this field of dict-valued rewards")
    rollout.addoption("--reward-timeout", type=float, default=60.0, help="seconds before a reward call fails")
    rollout.addoption("--reward-errors", default="zero", choices=["zero", "fail"],
                      help="on a failing reward: score the sample 0 and go on, or stop the run")

    schedule = parser.getgroup("schedule", "how rollout, training and weight sync are placed and overlapped")
    schedule.addoption("--engines", type=int, default=1, help="rollout engines")
    schedule.addoption("--trainer-workers", type=int, default=1, help="data-parallel trainer processes")
    schedule.addoption("--placement", default="colocate", choices=["colocate", "disaggregate"],
                       help="colocate: trainer and engines share devices (engines release memory while "
                            "training); disaggregate: separate pools")
    schedule.addoption("--schedule", default="sync", choices=["sync", "async"],
                       help="async: the rollout of step k+1 overlaps training of step k (disaggregate only)")
    schedule.addoption("--update-weights-interval", type=int, default=1, help="sync weights every N steps")
    schedule.addoption("--max-staleness", type=int, default=None,
                       help="drop samples generated more than N weight versions ago (async)")
    schedule.addoption("--partial-rollout", action="store_true",
                       help="groups aborted at the end of a step keep their tokens and resume in a later step")
    schedule.addoption("--mask-offpolicy-in-partial-rollout", action="store_true",
                       help="zero the loss mask on tokens generated by older weights in resumed samples")

    evaluation = parser.getgroup("evaluation")
    evaluation.addoption("--eval-interval", type=int, default=10, help="evaluate every N steps (0: never)")
    evaluation.addoption("--eval-temperature", type=float, default=0.0, help="0 is greedy")
    evaluation.addoption("--stop-at-eval-acc", type=float, default=None, help="stop once eval accuracy reaches this")

    train = parser.getgroup("training", "shared by every trainer")
    train.addoption("--lr", type=float, default=None, help=f"learning rate (default {FALLBACKS['lr']})")
    train.addoption("--lr-schedule", default="constant", choices=["constant", "linear", "cosine"])
    train.addoption("--lr-warmup-steps", type=int, default=0)
    train.addoption("--min-lr", type=float, default=0.0)
    train.addoption("--weight-decay", type=float, default=0.0)
    train.addoption("--adam-beta1", type=float, default=0.9)
    train.addoption("--adam-beta2", type=float, default=0.99)
    train.addoption("--clip-grad", type=float, default=1.0, help="max global grad norm (0: off)")
    train.addoption("--global-batch-size", type=int, default=None,
                    help="samples per optimizer step (default: the whole rollout, one update per step)")
    train.addoption("--micro-batch-size", type=int, default=256, help="samples per forward/backward")
    train.addoption("--save-interval", type=int, default=50, help="checkpoint every N steps (and at the end)")
    train.addoption("--keep-checkpoints", type=int, default=2, help="complete checkpoints kept on disk")
    train.addoption("--update-weight-buffer-size", type=int, default=512 * 1024**2,
                    help="bytes per weight-sync bucket")
    train.addoption("--critic-lr", type=float, default=None,
                    help="learning rate of the critic, for losses that need one (default: --lr)")
    train.addoption("--critic-warmup-steps", type=int, default=0,
                    help="first N steps train only the critic; the policy is not updated")

    algo = parser.getgroup("algorithm", "shared by every loss")
    algo.addoption("--eps-clip", type=float, default=0.2, help="PPO clip range (low side)")
    algo.addoption("--eps-clip-high", type=float, default=None, help="PPO clip high side (default: --eps-clip)")
    algo.addoption("--eps-clip-c", type=float, default=None, help="dual-clip bound c > 1 (off by default)")
    algo.addoption("--kl-coef", type=float, default=0.0, help="KL to the reference as a reward penalty")
    algo.addoption("--kl-loss-coef", type=float, default=0.0, help="KL to the reference as a loss term")
    algo.addoption("--kl-estimator", default="k3", choices=["k1", "k2", "k3", "low-var-kl"],
                   help="per-token estimate of KL to the reference (low-var-kl: k3 clamped to [-10, 10])")
    algo.addoption("--entropy-coef", type=float, default=0.0, help="entropy bonus: this times the entropy is "
                   "subtracted from the loss")
    algo.addoption("--loss-agg", default=None,
                   choices=["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"],
                   help="how per-token losses are averaged (default: the loss's own, token-mean for most; "
                        "seq-mean-token-sum-norm for dr-grpo, seq-mean-token-mean for gspo)")
    algo.addoption("--advantage-whiten", action="store_true",
                   help="whiten advantages across the batch: (A - mean) / std over all trained tokens")
    algo.addoption("--disable-std-normalization", action="store_true",
                   help="group-relative advantages are r - mean, not divided by the group's std")
    algo.addoption("--gamma", type=float, default=1.0, help="discount of per-token returns (PPO, REINFORCE++)")
    algo.addoption("--lambd", type=float, default=1.0, help="GAE lambda (PPO)")
    algo.addoption("--overlong-buffer-len", type=int, default=None,
                   help="DAPO's overlong shaping: penalise responses longer than --max-new-tokens minus this "
                        "many tokens, linearly (default: off; dapo: a fifth of --max-new-tokens)")
    algo.addoption("--overlong-penalty-factor", type=float, default=1.0,
                   help="the overlong penalty at --max-new-tokens tokens")
    algo.addoption("--tis", action="store_true",
                   help="truncated importance sampling: weight each token's policy loss by "
                        "clamp(exp(old - rollout log-prob), --tis-clip-low, --tis-clip)")
    algo.addoption("--icepop", action="store_true",
                   help="IcePop: weight by exp(old - rollout log-prob) inside [--tis-clip-low, --tis-clip], "
                        "drop tokens outside")
    algo.addoption("--tis-clip", type=float, default=None, help="upper edge of the band (default: 2 for --tis, "
                   "5 for --icepop)")
    algo.addoption("--tis-clip-low", type=float, default=None, help="lower edge of the band (default: 0 for "
                   "--tis, 0.5 for --icepop)")


@hookimpl(trylast=True)
def plasmid_configure(config: Config) -> None:
    option = config.option
    for name, value in FALLBACKS.items():
        if getattr(option, name, None) is None:
            setattr(option, name, value)
    option.reward_weights = [reward_spec(text) for text in (option.reward or [])]
    if option.kl_coef and option.kl_loss_coef:
        raise UsageError("use KL either as a reward penalty (--kl-coef) or as a loss term (--kl-loss-coef), not both")
    _configure_rollout_correction(option)
    if option.critic_lr is None:
        option.critic_lr = option.lr
    if option.critic_warmup_steps < 0:
        raise UsageError("--critic-warmup-steps must be >= 0")
    if not (0 <= option.gamma <= 1 and 0 <= option.lambd <= 1):
        raise UsageError(f"--gamma ({option.gamma}) and --lambd ({option.lambd}) must be in [0, 1]")
    for name in ("prompts_per_step", "n_samples_per_prompt", "num_rollouts", "micro_batch_size"):
        if getattr(option, name) < 1:
            raise UsageError(f"--{name.replace('_', '-')} must be >= 1")
    if option.over_sampling < 1:
        raise UsageError("--over-sampling must be >= 1")
    if option.schedule == "async" and option.placement == "colocate":
        raise UsageError("--schedule async overlaps rollout and training, which needs --placement disaggregate")
    for name in ("engines", "trainer_workers", "update_weights_interval"):
        if getattr(option, name) < 1:
            raise UsageError(f"--{name.replace('_', '-')} must be >= 1")


#: ``(--tis-clip-low, --tis-clip)`` when left unset: slime's TIS defaults, the IcePop paper's band.
ROLLOUT_CORRECTION_BANDS = {"tis": (0.0, 2.0), "icepop": (0.5, 5.0)}


def _configure_rollout_correction(option) -> None:
    """Fill the TIS/IcePop band (:data:`ROLLOUT_CORRECTION_BANDS`) where unset, and check it."""
    if option.tis and option.icepop:
        raise UsageError("--tis truncates the importance weights and --icepop masks them: choose one")
    low, high = ROLLOUT_CORRECTION_BANDS["icepop" if option.icepop else "tis"]
    if option.tis_clip_low is None:
        option.tis_clip_low = low
    if option.tis_clip is None:
        option.tis_clip = high
    if not 0 <= option.tis_clip_low < option.tis_clip:
        raise UsageError(f"the importance-weight band needs 0 <= --tis-clip-low < --tis-clip, got "
                         f"[{option.tis_clip_low}, {option.tis_clip}]")


def default_run_dir(cwd: str | None = None) -> Path:
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
    return Path(cwd or os.getcwd()) / "runs" / stamp
