"""warmfleet.operator: the Kubernetes operator (kopf), an I/O shell of the control plane.

Observes the cluster (``observe``), asks the pure planner (``warmfleet.control``) what should
exist, renders it as Kubernetes objects (``render``, ``manifests``) and applies it through
``warmfleet.kube``. It speaks ``warmfleet.api`` and never imports the gateway, the emulator or the
agent: it reads gateways' metrics over HTTP (``gateway_metrics``).
"""
