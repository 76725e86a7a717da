"""plasmid-gym: gym-style text environments (``--gym-env PACKAGE:ENV_ID``) as a data source (episode
seeds), a multi-turn generate function (observations as user turns, the model's turns as actions,
token in, token out) and a reward (the episode's summed or discounted rewards)."""
