"""A tiny Hugging Face tokenizer written to a directory (``tokenizer_path`` of a Gateway, or
``HfChatTokenizer.from_dir``): no hub, no model download."""

from __future__ import annotations

import json
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors

# Qwen3-like: enable_thinking=false writes an empty think block after the generation prompt.
TEMPLATE = (
    "{{ bos_token }}"
    "{% if tools %}<tools>{% for t in tools %}{{ t | tojson }}{% endfor %}</tools>{% endif %}"
    "{% if documents %}<docs>{% for d in documents %}[{{ d.title }}|{{ d.text }}]{% endfor %}"
    "</docs>{% endif %}"
    "{% if reasoning_effort %}<effort>{{ reasoning_effort }}</effort>{% endif %}"
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content | trim }}<|im_end|>\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n"
    "{% if enable_thinking is defined and enable_thinking is false %}<think>\n\n</think>\n\n"
    "{% endif %}{% endif %}"
)
SPECIALS = ["<s>", "</s>", "<|im_start|>", "<|im_end|>"]


def write_model(directory: Path, template: str = TEMPLATE) -> Path:
    """A lossless byte-level tokenizer (one id per byte, no merges) with a BOS post-processor."""
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    tok = Tokenizer(models.BPE(vocab={c: i for i, c in enumerate(alphabet)}, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(SPECIALS)
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A", special_tokens=[("<s>", tok.token_to_id("<s>"))]
    )
    tok.save(str(directory / "tokenizer.json"))
    config = {"bos_token": "<s>", "eos_token": "</s>", "chat_template": template}
    (directory / "tokenizer_config.json").write_text(json.dumps(config))
    return directory
