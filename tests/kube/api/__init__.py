"""The Kubernetes API double's resources: one module per API group, listed in ``registry``.

``schema`` says what a resource is (its kind, scope, verbs, subresources and the defaults the
API server fills in); ``core``, ``apps`` and ``batch`` are the groups served; ``rest`` serves
any registered resource as the API server does (discovery, get, list, watch, create, update,
patch, delete, namespaces' lifecycle, ownerReference garbage collection), with the errors as
``errors`` words them. A new group is a new module with a ``GROUP`` added to ``registry.GROUPS``.
"""
