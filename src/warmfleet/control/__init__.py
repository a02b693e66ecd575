"""warmfleet.control: the fleet controller's planning, pure.

From observed state (``observed``) and the resource model (``warmfleet.api``) it decides what
should exist: the reconciler, cache-gated rollouts, warm-first placement, autoscaling and the
status it reports. No I/O: the operator (``warmfleet.operator``) and the local fleet
(``warmfleet.local``) observe and act for it. It may import ``api``, ``cache``, ``routing`` and
``core``.
"""
