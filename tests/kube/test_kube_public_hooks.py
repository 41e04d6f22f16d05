"""KubeGpuSpawner uses KubeSpawner through its public methods and hooks, not its private ones.

A private method (``_start``, ``_make_create_pod_request`` ...) can change in any KubeSpawner
release without notice; pinning a major version does not protect an override of it. The one
allowed exception says why in its docstring and in docs/kubernetes.md.
"""

import inspect

from kubespawner import KubeSpawner

from spawner.kube import KubeGpuSpawner

# KubeSpawner starts its class-wide reflectors inside its own methods with no public hook around
# that start (spawner/kube.py, KubeGpuSpawner._start_reflector, says what it mends).
ALLOWED = {"_start_reflector"}


def private_overrides(spawner_class: type, base: type) -> set[str]:
    """Names of ``base``'s private methods (not dunders) that ``spawner_class`` or its mixins define again.

    Methods only: traitlets' metaclass gives every class its own private bookkeeping attributes.
    """
    ours = [cls for cls in spawner_class.__mro__ if cls not in base.__mro__]
    return {
        name
        for cls in ours
        for name in vars(cls)
        if name.startswith("_") and not name.startswith("__") and inspect.isfunction(getattr(base, name, None))
    }


def test_no_private_kubespawner_method_is_overridden_but_the_documented_one() -> None:
    assert private_overrides(KubeGpuSpawner, KubeSpawner) <= ALLOWED


def test_the_check_finds_a_private_override() -> None:
    class Overrides(KubeGpuSpawner):
        async def _make_create_pod_request(self, pod: object, request_timeout: int) -> bool:
            return True

    assert private_overrides(Overrides, KubeSpawner) - ALLOWED == {"_make_create_pod_request"}
