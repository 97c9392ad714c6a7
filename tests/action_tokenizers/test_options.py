"""Every tokenizer declares its fit options once, as ``cls.Options``: the registry and config generators read it."""

import dataclasses
import inspect

import action_tokenizers as at
import numpy as np
import pytest


@pytest.mark.parametrize("name", sorted(at.TOKENIZERS))
def test_fit_declares_no_option_of_its_own(name, train_chunks):
    """``fit`` takes the chunks and keyword options only: the names and defaults live in ``Options`` alone, each with
    a one-line help; a name ``Options`` lacks is refused with the ones it has."""
    cls = at.TOKENIZERS[name]
    params = list(inspect.signature(cls.fit).parameters.values())[1:]  # after chunks
    assert [p.kind for p in params] == [inspect.Parameter.VAR_KEYWORD]
    for f in dataclasses.fields(cls.Options):
        assert isinstance(f.metadata.get("help"), str) and f.metadata["help"] and "\n" not in f.metadata["help"]
    with pytest.raises(
        TypeError, match=f"has no option 'n_bin'; its options: {dataclasses.fields(cls.Options)[0].name}"
    ):
        cls.fit(train_chunks[:50], n_bin=8)


@pytest.mark.parametrize("name", ["fast", "bin", "beast"])
def test_fit_with_the_default_options_is_fit(name, train_chunks, heldout_chunks):
    cls = at.TOKENIZERS[name]
    a = cls.fit(train_chunks[:800], **dataclasses.asdict(cls.Options()))
    b = cls.fit(train_chunks[:800])
    assert a._config() == b._config() and a.encode(heldout_chunks) == b.encode(heldout_chunks)


def test_one_name_per_tokenizer():
    assert sorted(at.TOKENIZERS) == ["beast", "bin", "fast", "fsq"]
    assert all(cls.name == name for name, cls in at.TOKENIZERS.items())


def test_fsq_options_fit_with_fewer_steps(train_chunks):
    options = dataclasses.replace(at.FSQTokenizer.Options(), hidden=8, depth=0, steps=10, show_progress=False)
    tok = at.FSQTokenizer.fit(train_chunks[:200], **dataclasses.asdict(options))
    assert tok.fit_report["steps"] == 10 and np.isfinite(tok.fit_report["final_train_mse"])
