"""Prometheus-driven autoscaling of CosyVoiceServices.

* ``policy``      the decision: a pure function (no clock, no I/O), shared by the operator and the simulator
* ``profile``     a replica's measured capacity (``bench.capacity``) and the rate it takes within a latency SLO
* ``forecast``    the recurring period of a service's own history and its seasonal forecast
* ``prometheus``  PromQL built from the server's metric names, scoped to one service's pods
* ``state``       the decision history as it is persisted in ``status.autoscaling.history``
* ``controller``  one evaluation for one CosyVoiceService: read metrics, decide, write spec.replicas and status
* ``traces``      randomised trace families (tuning and held-out sets), CSV replay, Prometheus export
* ``simulate``    trace-driven simulator: the policy against HPA v2, KEDA, a static pool and an oracle
"""
