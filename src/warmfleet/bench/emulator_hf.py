"""The emulator's tokenization as a Hugging Face tokenizer directory, for the gateway's ``tokens``
key mode in front of an emulated fleet (``make bench-doctor``).

The emulator cuts text into pieces by ``\\s*\\S{1,4}|\\s+`` (docs/emulator.md: optional leading
whitespace plus up to four non-space characters, or a run of whitespace) with its chat template's
special tokens as single tokens, and renders a chat like Llama 3 with no text between the special
tokens. ``write_emulator_tokenizer`` writes a ``tokenizer.json`` (a word-level model over the
pieces of the given texts, split by the same pattern, the special tokens as added tokens) and a
``tokenizer_config.json`` with the same chat template, so a gateway in ``tokens`` mode counts
exactly the emulator's tokens and cuts its blocks where the emulator's engines cut theirs: a
capture's ``hash_ids`` are then the engines' blocks. Ids differ from the emulator's (only the
block boundaries and which blocks are equal matter to routing and replay); a piece not seen in
the given texts becomes ``[UNK]`` (still one token: counts stay exact, only its identity is lost).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from pathlib import Path

from tokenizers import Regex, Tokenizer, models, pre_tokenizers, processors

from warmfleet.emulator.tokenizer import BOS, EOS, SPECIAL_IDS

PIECE_PATTERN = r"\s*\S{1,4}|\s+"  # the emulator's (docs/emulator.md "Tokenization")
UNK = "[UNK]"
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}<|start_header_id|>{{ m['role'] }}<|end_header_id|>"
    "{{ m['content'] }}<|eot_id|>{% endfor %}"
    "{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>{% endif %}"
)
ROLES = ("system", "user", "assistant", "tool")


def pieces_of(texts: Iterable[str]) -> set[str]:
    """Every emulator piece of ``texts`` (special tokens are not pieces)."""
    piece = re.compile(PIECE_PATTERN)
    found: set[str] = set(ROLES)
    for text in texts:
        found.update(piece.findall(text))
    return found


def write_emulator_tokenizer(directory: Path, texts: Iterable[str]) -> Path:
    """``directory``/tokenizer.json and tokenizer_config.json (see the module docstring)."""
    vocab: dict[str, int] = {UNK: 0, **SPECIAL_IDS}
    first = max(vocab.values()) + 1
    for offset, piece in enumerate(sorted(pieces_of(texts))):
        vocab[piece] = first + offset
    tok = Tokenizer(models.WordLevel(vocab, unk_token=UNK))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(PIECE_PATTERN), behavior="isolated")
    tok.add_special_tokens(list(SPECIAL_IDS))
    # a completions prompt is BOS then the text, as the emulator (and vLLM) encode it
    tok.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A", special_tokens=[(BOS, SPECIAL_IDS[BOS])]
    )
    directory.mkdir(parents=True, exist_ok=True)
    tok.save(str(directory / "tokenizer.json"))
    config = {"bos_token": BOS, "eos_token": EOS, "chat_template": CHAT_TEMPLATE}
    (directory / "tokenizer_config.json").write_text(json.dumps(config), encoding="utf-8")
    return directory
