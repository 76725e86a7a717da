"""``plasmid parity``: an engine's and a trainer's log-probs of the same tokens compared, and the
first layer where they diverge (:mod:`plasmid_parity.command`)."""
