"""The portal's only I/O: the hub's REST API, Prometheus, Alertmanager and the local ledger.

Each module takes its client as an argument and returns typed models; the pages call
them through the cached functions in ``portal.sources``.
"""
