"""warmfleet.gateway.discovery: where a variant's instances come from.

Static lists live in the configuration document itself; ``files`` polls a YAML/JSON file;
``kubernetes`` follows EndpointSlices (``endpointslices`` turns them into instances, pure) and
``inference_endpoints`` follows the fleet controller's ``InferenceEndpoint`` objects. Each source
feeds the gateway's live state (``warmfleet.gateway.world``); it may import the gateway's
configuration and state, ``warmfleet.kube`` and ``warmfleet.api``.
"""
