"""Runnable examples: GPT models in Flax NNX and Equinox trained under remat plans."""
