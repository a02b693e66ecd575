"""warmfleet.cache: pure cache planning for model weights and images.

Manifests and content keys, capacity admission, refcounts and pins, LRU eviction, transfer plans
and source URIs. Synchronous and I/O-free; it imports ``warmfleet.core`` only. The node agent
executes its plans; the control plane reads its state.
"""
