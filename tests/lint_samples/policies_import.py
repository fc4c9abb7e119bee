"""RM001: importing jax.checkpoint_policies as a module."""
import jax
import jax.checkpoint_policies
import jax.checkpoint_policies as cp
from jax.checkpoint_policies import SaveOnlyTheseNames, save_only_these_names
import os, jax.ad_checkpoint.checkpoint_policies
from jax.ad_checkpoint.checkpoint_policies import nothing_saveable

# Not flagged: attribute access and from-imports of the attribute work on every version.
from jax import checkpoint_policies
from jax.ad_checkpoint import checkpoint_policies as acp
import jax.ad_checkpoint

policy = jax.checkpoint_policies.SaveOnlyTheseNames(frozenset({"h"}))
other = checkpoint_policies.save_only_these_names("h")
