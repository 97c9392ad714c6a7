"""The text side of the prompt: the text tokenizers (a compact built-in one and a local Gemma one), the prompt's
fixed pieces and the words worth one id each.

    text = ByteTextTokenizer(prompt_words(["push the puck to a goal"]))
    ids = text.encode("Task: push the puck to a goal, State:")    # 2 ids instead of 37 bytes
    text.decode(ids)                                               # the same string back

The token layout (where these ids go in a sequence, who attends to whom) is ``vla.model.sequence``'s job.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path
from typing import Protocol

ACTION_MARKER = "Action: "  # the first suffix tokens: fixed, so fed with the prompt at inference
END_OF_ACTIONS = "|"  # closes the action ids; generation stops here
TEXT_TOKENIZER_DIR = "text_tokenizer"


class TextTokenizer(Protocol):
    """What the layout needs from a text tokenizer."""

    size: int  # text ids are in [0, size)
    pad_id: int
    bos_id: int
    eos_id: int
    image_id: int  # the placeholder PaliGemma replaces with image features

    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: list[int]) -> str: ...


class ByteTextTokenizer:
    """A compact, download-free text vocabulary: 4 special ids, one id per UTF-8 byte, one id per small number,
    and optionally one id per listed word.

    ``<pad>`` 0, ``<bos>`` 1, ``<eos>`` 2, ``<image>`` 3, byte ``b`` -> ``4 + b``, the word ``" n"`` (a space then an
    integer ``0 <= n < 256`` written without leading zeros) -> ``260 + n``, and ``words[i]`` -> ``516 + i``. The
    number words keep the discretised state short (a 39-D state is 39 ids instead of ~150 bytes); the listed words
    do the same for the prompt's fixed text and the task (``prompt_words``): a small model's compute grows with
    the sequence, and "Task: push the puck to a goal, State:" is 37 bytes but 8 words. Every string encodes (the
    longest listed word wins; anything else falls back to bytes), and decodes back to itself.
    """

    name = "bytes"
    pad_id, bos_id, eos_id, image_id = 0, 1, 2, 3
    offset = 4
    number_offset = offset + 256
    word_offset = number_offset + 256
    _number = r" (?P<number>0|[1-9][0-9]{0,2})(?![0-9])"

    def __init__(self, words: list[str] | tuple[str, ...] = ()):
        words = tuple(words)
        bad = [w for w in words if not isinstance(w, str) or not w]
        if bad or len(set(words)) != len(words):
            raise ValueError(f"words must be distinct non-empty strings, got {list(words)}")
        self.words = words
        self.size = self.word_offset + len(words)
        self._word_ids = {w: self.word_offset + i for i, w in enumerate(words)}
        alternatives = [self._number]
        if words:  # longest first, so the regex prefers " pushing" to " push"
            alternatives.append(
                "(?P<word>" + "|".join(re.escape(w) for w in sorted(words, key=len, reverse=True)) + ")"
            )
        self._pattern = re.compile("|".join(alternatives))

    def encode(self, text: str) -> list[int]:
        ids, pos = [], 0
        for match in self._pattern.finditer(text):
            number = match.group("number")
            if number is not None and int(number) >= 256:
                continue  # spelled out in bytes
            ids.extend(self.offset + b for b in text[pos : match.start()].encode("utf-8"))
            ids.append(self.number_offset + int(number) if number is not None else self._word_ids[match.group()])
            pos = match.end()
        ids.extend(self.offset + b for b in text[pos:].encode("utf-8"))
        return ids

    def decode(self, ids: list[int]) -> str:
        out, pending = [], bytearray()
        for i in ids:
            if self.offset <= i < self.number_offset:
                pending.append(i - self.offset)
                continue
            if self.number_offset <= i < self.word_offset:
                piece = f" {i - self.number_offset}"
            elif self.word_offset <= i < self.size:
                piece = self.words[i - self.word_offset]
            else:
                continue  # special ids carry no text
            out.append(pending.decode("utf-8", errors="replace") + piece)
            pending = bytearray()
        return "".join(out) + pending.decode("utf-8", errors="replace")


def prompt_words(tasks: list[str]) -> list[str]:
    """Words worth one id each for prompts about ``tasks``: the template's fixed pieces, then every task's words
    (with their leading space), in first-seen order. For ``ByteTextTokenizer(words=...)``."""
    fixed = ["Task:", ", State:", ";\n", ACTION_MARKER]  # no space after "State:": numbers are " n" words
    found = dict.fromkeys(fixed)
    for task in tasks:
        for piece in re.findall(r" ?[^ ]+", clean_task(task)):
            found.setdefault(piece if piece.startswith(" ") else " " + piece, None)
    return list(found)


class LocalTextTokenizer:
    """A Hugging Face ``tokenizer.json`` read from a local directory (PaliGemma's Gemma tokenizer), no download.

    The directory may be a PaliGemma checkpoint folder or the ``text_tokenizer/`` folder a saved policy holds.
    """

    name = "local"

    def __init__(self, directory: str | Path, size: int | None = None):
        from tokenizers import Tokenizer  # Hugging Face's; imported here so the compact path never needs it

        self.directory = Path(directory)
        self.path = self.directory / "tokenizer.json"
        if not self.path.is_file():
            raise ValueError(
                f"no tokenizer.json in {self.directory}; point to a local PaliGemma checkpoint folder "
                "(it holds tokenizer.json beside config.json) or use the compact vocabulary"
            )
        self.tok = Tokenizer.from_file(str(self.path))
        self.size = int(size) if size is not None else self.tok.get_vocab_size(with_added_tokens=False)

        def special(token: str, fallback: int | None = None) -> int:
            i = self.tok.token_to_id(token)
            if i is None:
                if fallback is None:
                    raise ValueError(f"{self.path} has no {token} token; is this a Gemma tokenizer?")
                return fallback
            return int(i)

        self.pad_id = special("<pad>")
        self.bos_id = special("<bos>")
        self.eos_id = special("<eos>")
        self.image_id = special("<image>", fallback=self.size)  # PaliGemma puts <image> right after the text ids

    def encode(self, text: str) -> list[int]:
        return self.tok.encode(text, add_special_tokens=False).ids

    def decode(self, ids: list[int]) -> str:
        return self.tok.decode(list(ids), skip_special_tokens=False)

    def save(self, directory: Path) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(self.path, directory / "tokenizer.json")


def clean_task(task: str) -> str:
    """openpi's task normalisation: strip, lower-case, ``_`` -> space, one line."""
    return " ".join(str(task).strip().lower().replace("_", " ").split())
