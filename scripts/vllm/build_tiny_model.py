"""Build a tiny, random-weight Llama model that real vLLM can serve on the CPU (no hub access).

Run with the vLLM venv's Python (it needs torch, transformers and tokenizers):

    .venv-vllm/bin/python scripts/vllm/build_tiny_model.py --out .cache/tiny-llama

- Tokenizer: byte-level BPE trained with ``tokenizers`` on this Python's standard-library sources
  (local text, sorted, so the result is the same on every machine with the same Python), with a
  BOS post-processor and a ChatML-style Jinja chat template in ``tokenizer_config.json``.
- Model: ``LlamaForCausalLM`` (hidden 384, 3 layers, 6 heads / 2 KV heads, ~11 M parameters),
  seeded random weights, saved as safetensors (float32: this CPU has no bf16 units).

Idempotent: a stamp file records the build parameters; a second run with the same parameters
does nothing. Prints timings.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import sysconfig
import time
from pathlib import Path

VOCAB_SIZE = 8192
HIDDEN = 384
LAYERS = 3
HEADS = 6
KV_HEADS = 2
INTERMEDIATE = 1024
MAX_POSITIONS = 8192
SEED = 1234
MAX_TRAIN_BYTES = 6_000_000
SPECIAL_TOKENS = ["<|begin_of_text|>", "<|end_of_text|>", "<|im_start|>", "<|im_end|>", "<|pad|>"]
BOS, EOS, PAD = SPECIAL_TOKENS[0], SPECIAL_TOKENS[1], SPECIAL_TOKENS[4]

# ChatML-like; string content only (vLLM's "string" content format joins text parts with "\n").
CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

PARAMS = {
    "vocab": VOCAB_SIZE,
    "hidden": HIDDEN,
    "layers": LAYERS,
    "heads": HEADS,
    "kv_heads": KV_HEADS,
    "intermediate": INTERMEDIATE,
    "max_positions": MAX_POSITIONS,
    "seed": SEED,
    "max_train_bytes": MAX_TRAIN_BYTES,
    "template": CHAT_TEMPLATE,
    "version": 1,
}


def training_files() -> list[str]:
    """Sorted stdlib sources up to ``MAX_TRAIN_BYTES`` (deterministic for one Python)."""
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    files: list[str] = []
    total = 0
    for path in sorted(stdlib.glob("*.py")):
        size = path.stat().st_size
        if total + size > MAX_TRAIN_BYTES:
            break
        files.append(str(path))
        total += size
    if not files:
        raise SystemExit(f"no training text found under {stdlib}")
    return files


def build_tokenizer(out: Path) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train(training_files(), trainer)
    bos_id = tok.token_to_id(BOS)
    tok.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A", pair=f"{BOS} $A {BOS} $B", special_tokens=[(BOS, bos_id)]
    )
    tok.save(str(out / "tokenizer.json"))
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": BOS,
        "eos_token": EOS,
        "pad_token": PAD,
        "add_bos_token": True,
        "add_eos_token": False,
        "clean_up_tokenization_spaces": False,
        "model_max_length": MAX_POSITIONS,
        "chat_template": CHAT_TEMPLATE,
    }
    (out / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")
    special = {"bos_token": BOS, "eos_token": EOS, "pad_token": PAD}
    (out / "special_tokens_map.json").write_text(json.dumps(special, indent=2) + "\n")


def build_model(out: Path) -> int:
    import torch
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(out / "tokenizer.json"))
    config = LlamaConfig(
        vocab_size=tok.get_vocab_size(),
        hidden_size=HIDDEN,
        intermediate_size=INTERMEDIATE,
        num_hidden_layers=LAYERS,
        num_attention_heads=HEADS,
        num_key_value_heads=KV_HEADS,
        max_position_embeddings=MAX_POSITIONS,
        bos_token_id=tok.token_to_id(BOS),
        eos_token_id=tok.token_to_id(EOS),
        pad_token_id=tok.token_to_id(PAD),
        tie_word_embeddings=False,
        torch_dtype="float32",
    )
    torch.manual_seed(SEED)
    model = LlamaForCausalLM(config).to(torch.float32)
    model.save_pretrained(str(out), safe_serialization=True)
    GenerationConfig(
        bos_token_id=config.bos_token_id,
        eos_token_id=config.eos_token_id,
        pad_token_id=config.pad_token_id,
    ).save_pretrained(str(out))
    return sum(p.numel() for p in model.parameters())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path(".cache/tiny-llama"))
    args = parser.parse_args()
    out: Path = args.out
    stamp = out / ".build-stamp"  # not .warmfleet*: the agent refuses those names (its own)
    digest = hashlib.sha256(json.dumps(PARAMS, sort_keys=True).encode()).hexdigest()
    if stamp.is_file() and stamp.read_text().strip() == digest:
        print(f"build_tiny_model: {out} up to date")
        return
    start_s = time.monotonic()
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    build_tokenizer(tmp)
    tok_s = time.monotonic() - start_s
    n_params = build_model(tmp)
    (tmp / ".build-stamp").write_text(digest + "\n")
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
    total_s = time.monotonic() - start_s
    print(
        f"build_tiny_model: {out}: {n_params / 1e6:.1f} M parameters; "
        f"tokenizer {tok_s:.1f} s, total {total_s:.1f} s"
    )


if __name__ == "__main__":
    main()
