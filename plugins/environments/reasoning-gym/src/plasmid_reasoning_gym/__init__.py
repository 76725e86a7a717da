"""plasmid-reasoning-gym: reasoning-gym's procedural tasks and scorers for plasmid.

The ``reasoning-gym`` data source (:mod:`plasmid_reasoning_gym.source`) serves a weighted mixture
of reasoning-gym datasets; the ``reasoning-gym`` reward (:mod:`plasmid_reasoning_gym.reward`)
scores a response with the entry's own dataset's ``score_answer``.
"""
