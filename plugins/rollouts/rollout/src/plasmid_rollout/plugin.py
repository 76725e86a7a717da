from plasmid import hookimpl


@hookimpl
def plasmid_rollouts(register):
    register("rollout", "plasmid_rollout.driver:AsyncRolloutDriver", default=True)


@hookimpl
def plasmid_addoption(parser):
    group = parser.getgroup("rollout driver")
    group.addoption("--rollout-max-launch-factor", type=int, default=4,
                    help="at most this many times the first wave of groups is started in one step "
                         "(bounds the work when filters drop most groups)")
