"""A byte-level GPT in Equinox trained under a remat plan (``train.py``; model in ``model.py``)."""
