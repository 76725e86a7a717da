"""plasmid-dynamic: dynamic sampling (DAPO, slime's ``--dynamic-sampling-filter-path``).

``--filter zero-std`` drops every group whose samples all scored the same reward: group-relative
advantages are zero there, so the group would cost training time and teach nothing. Combine it
with ``--over-sampling`` so that enough groups survive to fill a step.
"""
