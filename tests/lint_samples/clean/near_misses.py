"""Nothing here is a hazard: names that only look like the flagged ones."""
import jax
import jax.numpy as jnp
import numpy as np

a = np.empty(3)
b = np.empty_like(a)


class Queue:
    def empty(self):
        return True

    def check(self):
        return self.empty()


def shadowed(jnp):
    return jnp.empty(3)


def local_numpy():
    import numpy as jnp
    return jnp.empty_like(np.zeros(2))


policy = jax.checkpoint_policies.SaveOnlyTheseNames(frozenset({"h"}))
names = jax.checkpoint_policies.save_any_names_but_these("h")
z = jnp.zeros(3)
text = "jnp.empty(3)  import jax.checkpoint_policies"
