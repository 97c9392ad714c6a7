import action_tokenizers as at
import numpy as np
import pytest
import scipy.fft
from action_tokenizers.synthetic import smooth_chunks

T, D = 10, 7


def extreme_chunks(time_horizon: int = T, action_dim: int = D) -> np.ndarray:
    """Chunks in [-1, 1] that reach the largest and smallest possible value of every DCT coefficient.

    Fitting on these makes the tokenizer's range cover any chunk in [-1, 1], so nothing is clipped.
    """
    basis = scipy.fft.idct(np.eye(time_horizon), axis=0, norm="ortho")  # column k: frequency k over time
    signs = np.sign(basis.T)  # [K, T]: maximises coefficient k
    signs[signs == 0] = 1
    rows = np.concatenate([signs, -signs])[:, :, None]
    return np.repeat(rows, action_dim, axis=2)


@pytest.fixture(scope="session")
def train_chunks() -> np.ndarray:
    return np.concatenate([smooth_chunks(3000, T, D, seed=0), extreme_chunks()])


@pytest.fixture(scope="session")
def heldout_chunks() -> np.ndarray:
    return smooth_chunks(500, T, D, seed=1)


@pytest.fixture(scope="session")
def fast_tok(train_chunks):
    return at.FASTTokenizer.fit(train_chunks, scale=10.0, vocab_size=512)


@pytest.fixture(scope="session")
def fast_bl_tok(train_chunks):
    return at.FASTTokenizer.fit(train_chunks, scale=10.0, vocab_size=512, byte_level=True)


@pytest.fixture(scope="session")
def fast_bl_wide(train_chunks):
    """Byte-level with ~330 symbols: code points above 127 take two UTF-8 bytes, and some ids split them."""
    tok = at.FASTTokenizer.fit(train_chunks, scale=50.0, vocab_size=1024, byte_level=True)
    assert tok.n_symbols > 128 and not tok._byte_decoder.whole.all()
    return tok


@pytest.fixture(scope="session")
def bin_tok(train_chunks):
    return at.BinningTokenizer.fit(train_chunks, n_bins=256)


@pytest.fixture(scope="session")
def fsq_tok(train_chunks):
    return at.FSQTokenizer.fit(train_chunks, hidden=32, depth=1, steps=400, show_progress=False)


@pytest.fixture(scope="session")
def beast_tok(train_chunks):
    return at.BEASTTokenizer.fit(train_chunks, n_control_points=6, degree=3)


@pytest.fixture(scope="session")
def all_toks(fast_tok, fast_bl_tok, bin_tok, fsq_tok, beast_tok):
    return {"fast": fast_tok, "fast_byte_level": fast_bl_tok, "bin": bin_tok, "fsq": fsq_tok, "beast": beast_tok}


@pytest.fixture(params=["fast", "fast_byte_level", "bin", "fsq", "beast"])
def tok(request, all_toks):
    return all_toks[request.param]
