"""The action-tokenizer choice, one type wherever a tokenizer is named: ``TokenizerConfig``, a draccus choice with
one registered subclass per entry of ``action_tokenizers``' registry, each carrying that tokenizer's fit options
(``--tokenizer.type=bin --tokenizer.n_bins=64`` on the command line, ``tokenizer: {type: bin, n_bins: 64}`` in a
config), and ``tokenizer_config(name, **options)`` to build one in code. ``build(chunks)`` loads
``pretrained_path`` or fits on normalised chunks."""

from __future__ import annotations

import dataclasses
import re
import typing
from dataclasses import dataclass, field
from typing import Any

import action_tokenizers as at
import draccus
import numpy as np
import yaml

from vla.names import check_name


@dataclass
class TokenizerConfig(draccus.ChoiceRegistry):
    # Load a tokenizer saved with save_pretrained (or `vla tokenizer fit`) instead of fitting one; its type must match.
    pretrained_path: str | None = None

    @property
    def type(self) -> str:
        return self.get_choice_name(type(self))

    def options(self) -> dict[str, Any]:
        """The fit options: every field but ``pretrained_path``."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "pretrained_path"}

    def fit(self, chunks: np.ndarray, **extra: Any) -> at.ActionTokenizer:
        """Fit on normalised chunks ``[N, T, D]`` with these options, ``extra`` on top (``show_progress=True``)."""
        return at.get_tokenizer_class(self.type).fit(chunks, **{**self.options(), **extra})

    def unfitted(self, time_horizon: int, action_dim: int) -> at.ActionTokenizer:
        """Load ``pretrained_path``, or build one without data for chunks ``[time_horizon, action_dim]`` (a tokenizer
        that learns nothing from them; the others refuse, saying what to do)."""
        if self.pretrained_path:
            return self.load()
        return at.get_tokenizer_class(self.type).unfitted(time_horizon, action_dim, **self.options())

    def build(self, chunks: np.ndarray) -> at.ActionTokenizer:
        """Load ``pretrained_path``, or fit on normalised training chunks ``[N, T, D]``."""
        return self.load() if self.pretrained_path else self.fit(chunks)

    def load(self) -> at.ActionTokenizer:
        """The tokenizer at ``pretrained_path``, of this config's type."""
        tok = at.load_tokenizer(self.pretrained_path)
        if tok.name != self.type:
            raise ValueError(
                f"{self.pretrained_path} holds a {tok.name!r} tokenizer, the config asks for {self.type!r}"
            )
        return tok


def _choice_for(name: str, cls: type[at.ActionTokenizer]) -> type[TokenizerConfig]:
    """A ``TokenizerConfig`` subclass with the fields of ``cls.Options``, registered as ``name``."""
    hints = typing.get_type_hints(cls.Options)
    fields = []
    for f in dataclasses.fields(cls.Options):
        default = (
            {"default": f.default} if f.default is not dataclasses.MISSING else {"default_factory": f.default_factory}
        )
        fields.append((f.name, hints[f.name], field(metadata=f.metadata, **default)))
    config_cls = dataclasses.make_dataclass(
        f"{cls.__name__.removesuffix('Tokenizer')}Config", fields, bases=(TokenizerConfig,)
    )
    config_cls.__module__ = __name__
    config_cls.__doc__ = f"Options of ``{cls.__name__}.fit`` (``--tokenizer.type={name}``)."
    return TokenizerConfig.register_subclass(name)(config_cls)


TOKENIZER_CONFIGS: dict[str, type[TokenizerConfig]] = {
    name: _choice_for(name, cls) for name, cls in at.TOKENIZERS.items()
}


DEFAULT_TOKENIZER = "fast"
NORMALIZER_FILE = (
    "action_normalizer.json"  # a fitted tokenizer folder's normaliser, beside its own files (`vla tokenizer fit`)
)


def tokenizer_config(name: str, **options: Any) -> TokenizerConfig:
    """The tokenizer choice ``name`` with ``options`` set, e.g. ``tokenizer_config("bin", n_bins=64)``."""
    return TOKENIZER_CONFIGS[at.get_tokenizer_class(name).name](**options)


def parse_choice(spec: str) -> TokenizerConfig:
    """``"bin:n_bins=128"`` -> the ``bin`` choice with ``n_bins=128`` (values read as YAML; commas inside ``[...]``
    belong to a value): the one-string spelling of ``--tokenizer.type=bin --tokenizer.n_bins=128``, which
    ``vla compare``, ``vla tokenizer fit`` and LeRobot's ``--policy.action_tokenizer_type`` take. An unknown name or
    option is a ``ValueError`` that suggests the closest."""
    name, _, rest = str(spec).strip().partition(":")
    cls = at.get_tokenizer_class(name)  # a clear error, with a suggestion, for an unknown name
    known = [f.name for f in dataclasses.fields(cls.Options)]
    options = {}
    for item in filter(None, re.split(r",(?![^\[]*\])", rest)):
        key, eq, value = item.partition("=")
        if not eq:
            raise ValueError(f"{spec!r}: write options as name:option=value,option=value (got {item!r})")
        check_name(f"{name} option", key.strip(), known)
        options[key.strip()] = yaml.safe_load(value)
    return tokenizer_config(name, **options)
