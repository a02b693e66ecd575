"""Fleet control plane planning (pure): resources, reconciler, placement, autoscaling."""
