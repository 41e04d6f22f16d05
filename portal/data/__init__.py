"""The portal's only I/O: the hub's REST API, Prometheus, Alertmanager, the ledger's reads, Kubernetes.

Each module takes its client as an argument and returns typed models; ``deployment`` is the
one place that tells one machine from Kubernetes. The pages call them through the cached
functions in ``portal.sources``.
"""
