"""The default served model's tokenizer: the harness's character vocabulary with a
byte-level fallback, so any text tokenizes.

Ids 0..29 are exactly ``harness.backends.tasks.TINY_TOKENIZER``'s (``<pad>``, ``<bos>``,
``<eos>``, then ``abcdefghij0123456789+-=?^: ``); ids 30..285 are the 256 bytes. A
character outside the vocabulary encodes as its UTF-8 bytes; decoding joins the bytes
back (an incomplete UTF-8 sequence decodes to U+FFFD, as byte-level BPE tokenizers do).
Special tokens decode to nothing unless ``skip_special_tokens=False`` (SGLang's default
is to skip them).

Chat template (the tiny model has none of its own; this one is defined here): each
message as ``"<role>: <content>\\n"``, then ``"assistant: "`` when a generation prompt is
asked for. ``TINY_CHAT_TEMPLATE`` is the same as a Jinja string, for a Hugging Face
``tokenizer_config.json``.
"""

from __future__ import annotations

from typing import Any, Iterable

from harness.backends.tasks import TINY_TOKENIZER

TINY_CHAT_TEMPLATE = (
    "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}assistant: {% endif %}"
)


class ByteFallbackTokenizer:
    def __init__(self, chars_tokenizer: Any = TINY_TOKENIZER) -> None:
        self.base = chars_tokenizer
        self.specials = tuple(chars_tokenizer.SPECIALS)
        self.byte_offset = chars_tokenizer.vocab_size
        self.stoi = {c: i for c, i in chars_tokenizer.stoi.items() if i >= len(self.specials)}
        self.itob = {i: c.encode("utf-8") for c, i in self.stoi.items()}
        self.pad_token_id = chars_tokenizer.pad_token_id
        self.bos_token_id = chars_tokenizer.bos_token_id
        self.eos_token_id = chars_tokenizer.eos_token_id

    @property
    def vocab_size(self) -> int:
        return self.byte_offset + 256

    def encode(self, text: str) -> list[int]:
        ids: list[int] = []
        for ch in text:
            tok = self.stoi.get(ch)
            if tok is not None:
                ids.append(tok)
            else:
                ids.extend(self.byte_offset + b for b in ch.encode("utf-8"))
        return ids

    def token_bytes(self, tok: int, *, skip_special_tokens: bool = True) -> bytes:
        if tok < len(self.specials):
            return b"" if skip_special_tokens else self.specials[tok].encode()
        if tok < self.byte_offset:
            return self.itob[tok]
        return bytes([tok - self.byte_offset])

    def decode(self, ids: Iterable[int], *, skip_special_tokens: bool = True) -> str:
        return b"".join(self.token_bytes(int(t), skip_special_tokens=skip_special_tokens) for t in ids).decode(
            "utf-8", "replace"
        )

    def convert_ids_to_tokens(self, ids: Iterable[int]) -> list[str]:
        return [self.token_bytes(int(t), skip_special_tokens=False).decode("utf-8", "replace") for t in ids]

    def apply_chat_template(self, messages: list[dict[str, Any]], *, add_generation_prompt: bool = True) -> str:
        text = "".join(f"{m.get('role', 'user')}: {m.get('content') or ''}\n" for m in messages)
        return text + ("assistant: " if add_generation_prompt else "")


TINY_SERVE_TOKENIZER = ByteFallbackTokenizer()
