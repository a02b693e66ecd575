"""Virtual-time fleet simulator and workloads (pure)."""
