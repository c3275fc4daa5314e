"""Prometheus-driven autoscaling of CosyVoiceServices.

* ``policy``      the decision: a pure function (no clock, no I/O), shared by the operator and the simulator
* ``prometheus``  PromQL built from the server's metric names, scoped to one service's pods
* ``controller``  one evaluation for one CosyVoiceService: read metrics, decide, write spec.replicas and status
* ``simulate``    trace-driven simulator: the policy against HPA v2, KEDA, an oracle and a static pool
"""
