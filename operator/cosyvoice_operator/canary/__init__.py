"""Canary rollouts: a second Deployment running ``spec.canary``'s version beside the stable one.

* ``traffic``   how many replicas and how much traffic each version gets (pure)
* ``analysis``  the automatic analysis: figures of both versions → next weight, promote or abort (pure)
* ``metrics``   PromQL per version and the reading of both versions' figures
* ``controller`` one evaluation: read the figures, apply the decision, write ``status.canary``
"""
