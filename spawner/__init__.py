"""The GPU-share core (pure) and the spawners that use it."""
