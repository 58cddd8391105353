"""The placement policy a site gets when its config names none (``policy:`` in etc/mig-batch.yaml).

One name, read by the site config (mig_batch.config) and shown by etc/mig-batch.yaml and docs/placement.md
("The default policy"), where the figures behind it are: the policy with the best mean served demand and
the smallest worst gap over the robustness suite and the held-out variants (mig_batch.sim.heldout).
Kept apart from mig_batch.placement.policies so that reading the config does not import the policies.
"""

DEFAULT_POLICY = "mix"
