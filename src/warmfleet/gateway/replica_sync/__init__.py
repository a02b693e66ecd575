"""Live gateway replicas sharing routing state (issue 22): ``spec.replicaSync``.

``config`` (the document's section), ``peers`` (who the peers are: static, a watched file, or
the ready endpoints of the gateway's own Service), ``transport`` (ZeroMQ PUB/SUB of note
batches, ROUTER/DEALER catch-up), ``service`` (the lifespan-owned piece wiring them to each
variant's ``routing.replicas.ReplicaView``). docs/replicas.md describes the whole.
"""
