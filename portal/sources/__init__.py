"""The data each page reads, one module per concern, cached for the live pages.

Pages call these; these call the data layer (portal/data: one module per external system,
and ``portal/data/deployment.py``, the one place that knows one machine from Kubernetes).
Whatever names people is narrowed here to the reader's scope (portal/data/access.py).

* ``clients``: the hub clients (the portal's read-only token, the reader's own) and the deployment
* ``classes``: the classes' rules and members, and whom a reader may see (the scope)
* ``servers``: notebook servers, their events and history, the GPUs and what holds them; stopping
* ``line``: the GPU line through the hub's API: the Queue, waits, reservations and changes to them
* ``metrics``: Prometheus: readings, trends, usage reports, the anomaly models' findings
* ``alerts``: Alertmanager and the incident store
* ``markets``: the image and model markets
"""
