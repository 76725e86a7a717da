"""plasmid's default rollout driver (provider ``rollout``)."""
