"""A byte-level GPT in Flax NNX trained under a remat plan (``train.py``; model in ``model.py``)."""
