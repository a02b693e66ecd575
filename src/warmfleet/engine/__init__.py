"""warmfleet.engine: a pure model of an LLM inference engine (vLLM-like).

Paged KV blocks with prefix caching and LRU eviction (``blocks``), continuous batching with
prefill/decode timing from a spec (``model``, ``spec``, ``presets``) and the events it emits.
Driven in virtual time by the simulator and in wall time by the emulator; it imports
``warmfleet.core`` only.
"""
