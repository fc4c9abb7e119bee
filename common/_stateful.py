"""Objects a framework updates in place (``pytree=False`` NNX modules), which measurement turns
into arrays and back: the kinds the adapters name (:attr:`Framework.stateful`)."""

from ._framework import stateful_kind as stateful_kind
