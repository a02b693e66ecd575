"""The embedded local backend: ``warmfleet up fleet.yaml`` runs a whole fleet on this machine."""
