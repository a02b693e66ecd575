"""Workloads shared by the simulator and the live load generator."""
