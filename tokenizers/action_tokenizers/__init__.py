"""action_tokenizers: continuous robot action chunks ``[T, D]`` <-> discrete ids, and back.

    import action_tokenizers as at
    tok = at.FASTTokenizer.fit(chunks)           # chunks: float [N, T, D], normalised
    ids = tok.encode(chunks[:4])                 # 4 lists of ints in [0, tok.vocab_size)
    out = tok.decode(ids)                        # out.actions [4, T, D], out.valid [4]
    tok.save_pretrained("tok/"); tok = at.load_tokenizer("tok/")

Four tokenizers, one interface (``at.TOKENIZERS``): FAST, binning, FSQ, BEAST; each declares its fit options as
a dataclass, ``cls.Options``.
"""

from .base import ActionTokenizer, DecodeError, DecodeResult, EncodeStats
from .beast import BEASTTokenizer
from .binning import BinningTokenizer
from .constraint import Constraint, LengthConstraint
from .fast import FASTTokenizer
from .fsq import FSQTokenizer
from .normalize import Normalizer
from .registry import TOKENIZERS, get_tokenizer_class, load_tokenizer, saved_type

__all__ = [
    "ActionTokenizer",
    "BEASTTokenizer",
    "BinningTokenizer",
    "Constraint",
    "DecodeError",
    "DecodeResult",
    "EncodeStats",
    "FASTTokenizer",
    "FSQTokenizer",
    "LengthConstraint",
    "Normalizer",
    "TOKENIZERS",
    "get_tokenizer_class",
    "load_tokenizer",
    "saved_type",
]
