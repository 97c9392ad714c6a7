"""The token layout of the policy: the only module that knows where each token goes and who sees whom.

pi0-FAST's layout (openpi; see REFERENCE.md), one row per sample:

    prefix (bidirectional)                                          suffix (causal)
    [<image> x n_image_tokens per camera] [BOS] "Task: {task}, State: {s};\\n"   "Action: " a_1 .. a_n "|" EOS

* ``{task}`` is lower-cased, stripped, ``_`` -> space; ``{s}`` is the *normalised* state cut into ``state_bins``
  uniform bins over [-1, 1], written as space-separated integers (values outside [-1, 1] are clipped and counted).
* ``state_encoding="embedding"`` (a departure from pi0-FAST, for models trained from scratch): the prompt reads
  ``"Task: {task}, State: " <s_1>..<s_k> ";\n"`` where the ``k`` state slots are not ids but embeddings the model
  computes from the normalised state (``vla.model.prefix_lm.StateEncoder``); ``Sequence.state_slots`` marks them.
* Without a state (an image-only policy, ``VLAConfig.state_dim = 0``: states ``[B, 0]``) the prefix is the images
  and ``BOS "Task: {task};\n"``: no state slot, no state text.
* The prefix-LM mask (openpi's cumulative-sum trick): every token carries ``ar`` (0 in the prefix, 1 in the suffix)
  and ``valid`` (0 for padding). Query q may attend key k iff both are valid and ``cumsum(ar)[k] <= cumsum(ar)[q]``:
  the prefix (cumsum 0) sees the whole prefix and never the suffix; suffix token i sees the prefix and suffix
  tokens up to i. Padding attends to nothing, nothing attends to padding, and padding takes no position
  (``position_ids = cumsum(valid) - 1``, 0 on padding).
* The loss is next-token cross-entropy on the suffix only (``Action: ``, the action ids, ``|`` and EOS).

``decoding="parallel"`` (one-pass decoding, for tokenizers with a fixed number ``n`` of ids per chunk) replaces the
suffix with ``n`` query slots::

    prefix (bidirectional)                                          slots (one bidirectional block)
    [<image> ...] [BOS] "Task: {task}, State: {s};\n"               <q_1> .. <q_n>

Slot ``i``'s input is not an id but a learned embedding of its own (``vla.model.prefix_lm.SlotEmbedding``;
``Sequence.query_slots`` marks the slots), and it predicts action id ``i`` *at its own position* (not the next
one): cross-entropy at every slot at once, on the slots only. Only the first slot has ``ar = 1``, so the slots
share one causal block: each sees the whole prefix and every slot, the prefix never sees a slot. A prompt is the
same row without targets; ``vla.model.decode.generate`` fills every slot in one forward pass.

Training rows are right-padded (``build_training_sequence``); inference prompts are left-padded
(``build_prefix``) so every row's next token is generated at the same column.
"""

from __future__ import annotations

import itertools
import logging
from dataclasses import dataclass

import numpy as np
import torch

from vla.model.text import clean_task
from vla.model.vocab import VocabMap

logger = logging.getLogger(__name__)

STATE_ENCODINGS = ("text", "embedding")
# "prefix_lm": the prefix attends both ways, the suffix causally (pi0-FAST); "causal": every position sees only what
# came before it, prefix included (a GPT), for the comparison that asks why a prefix-LM.
ATTENTIONS = ("prefix_lm", "causal")
# "autoregressive": action ids one at a time after "Action: " (pi0-FAST); "parallel": one query slot per id of a
# fixed-length chunk, all predicted in one forward pass (see the module docstring)
DECODINGS = ("autoregressive", "parallel")
_STATE_SLOT = -1  # marks a state slot in a prefix row until _pack turns it into a padded id + state_slots
_QUERY_SLOT = -2  # marks a parallel query slot until _pack turns it into a padded id + query_slots


# --- the layout --------------------------------------------------------------------------------------------
@dataclass
class LayoutStats:
    """What building sequences had to change: clipped state values and truncated tasks, counted."""

    state_clipped: int = 0
    tasks_truncated: int = 0


@dataclass
class Sequence:
    """A padded batch of token rows with everything the model needs. Shapes: B rows, L columns.

    ``attention_mask`` is built on demand from ``valid`` and ``ar`` by ``prefix_lm_mask``.
    """

    input_ids: torch.Tensor  # long [B, L]
    valid: torch.Tensor  # bool [B, L], False on padding
    ar: (
        torch.Tensor
    )  # long [B, L], 1 where a token opens a causal block: the suffix (prefix-LM) or every token (causal)
    position_ids: torch.Tensor  # long [B, L], cumsum(valid) - 1, 0 on padding
    targets: torch.Tensor  # long [B, L], the id predicted at each position (next token), pad elsewhere
    loss_mask: torch.Tensor  # bool [B, L], positions whose target is a suffix token
    action_mask: torch.Tensor  # bool [B, L], positions whose target is an action id
    prefix_len: torch.Tensor  # long [B], prefix tokens per row (padding excluded)
    state: torch.Tensor  # float32 [B, S], the normalised state (read by the model only at state slots)
    state_slots: torch.Tensor  # bool [B, L], positions whose embedding comes from ``state`` (all False for text)
    query_slots: torch.Tensor  # bool [B, L], parallel decoding's slots (learned embeddings; all False otherwise)

    @property
    def attention_mask(self) -> torch.Tensor:
        """bool [B, L, L]: True where query (row) may attend key (column)."""
        return prefix_lm_mask(self.valid, self.ar)

    @property
    def token_type_ids(self) -> torch.Tensor:
        """PaliGemma's convention: 0 for the prefix, 1 for the suffix (what the loss is on)."""
        return self.ar

    def to(self, device: torch.device | str) -> Sequence:
        return Sequence(**{k: v.to(device) for k, v in self.__dict__.items()})

    def __len__(self) -> int:
        return self.input_ids.shape[0]


def prefix_lm_mask(valid: torch.Tensor, ar: torch.Tensor) -> torch.Tensor:
    """openpi's prefix-LM mask in three lines: ``valid`` bool [B, L], ``ar`` int [B, L] -> bool [B, L, L].

    A query sees every key whose causal block (cumulative sum of ``ar``) is not after its own: prefix tokens share
    block 0, each suffix token opens a new block. Padding is removed on both sides.
    """
    block = torch.cumsum(ar, dim=1)  # [B, L]
    mask = block[:, None, :] <= block[:, :, None]  # [B, Lq, Lk]
    return mask & valid[:, None, :] & valid[:, :, None]


class SequenceLayout:
    """Builds prefixes and training sequences for one vocabulary and one observation shape.

    ``image_tokens``: image tokens per camera; ``num_cameras``: cameras per observation (0: state + task only);
    ``max_prefix_len``: most *text* tokens in the prefix (BOS + task + state; image tokens not counted). A task
    that does not fit is cut (a logged, counted truncation); a state that does not fit alone is an error.
    ``state_encoding``: ``"text"`` (pi0-FAST: the state as ``state_bins`` integers) or ``"embedding"`` (``state_tokens``
    slots the model fills from the continuous state). ``decoding``: ``"autoregressive"`` (the suffix above) or
    ``"parallel"`` (``num_slots`` query slots after the prefix, one per action id of a fixed-length chunk).
    """

    def __init__(
        self,
        vocab: VocabMap,
        *,
        image_tokens: int = 0,
        num_cameras: int = 0,
        max_prefix_len: int = 256,
        state_bins: int = 256,
        state_encoding: str = "text",
        state_tokens: int = 1,
        attention: str = "prefix_lm",
        decoding: str = "autoregressive",
        num_slots: int = 0,
    ):
        if attention not in ATTENTIONS:
            raise ValueError(f"attention must be one of {', '.join(ATTENTIONS)}, got {attention!r}")
        self.attention = attention
        if decoding not in DECODINGS:
            raise ValueError(f"decoding must be one of {', '.join(DECODINGS)}, got {decoding!r}")
        if decoding == "parallel" and num_slots < 1:
            raise ValueError(f"parallel decoding needs num_slots >= 1 (the tokenizer's ids per chunk), got {num_slots}")
        self.decoding = decoding
        self.num_slots = int(num_slots) if decoding == "parallel" else 0
        if state_bins < 2:
            raise ValueError(f"state_bins must be >= 2, got {state_bins}")
        if state_encoding not in STATE_ENCODINGS:
            raise ValueError(f"state_encoding must be one of {', '.join(STATE_ENCODINGS)}, got {state_encoding!r}")
        if state_tokens < 1:
            raise ValueError(f"state_tokens must be >= 1, got {state_tokens}")
        self.state_encoding = state_encoding
        self.state_tokens = int(state_tokens)
        self.vocab = vocab
        self.image_tokens = int(image_tokens)
        self.num_cameras = int(num_cameras)
        self.max_prefix_len = int(max_prefix_len)
        self.state_bins = int(state_bins)
        self.stats = LayoutStats()
        self._edges = np.linspace(-1.0, 1.0, self.state_bins + 1)[:-1]
        # (task, state size) -> prefix ids, where they do not depend on the state's values (state slots or no state)
        # and the task fitted whole: the same prompt is spelled once, not once per sample.
        self._prefixes: dict[tuple[str, int], list[int]] = {}

    @property
    def num_image_tokens(self) -> int:
        return self.image_tokens * self.num_cameras

    # --- text ----------------------------------------------------------------------------------------------
    def clipped_state(self, state: np.ndarray) -> np.ndarray:
        """Normalised state ``[S]`` checked (finite) and clipped to [-1, 1]; clipped values are counted."""
        state = np.asarray(state, dtype=np.float64).reshape(-1)
        if not np.isfinite(state).all():
            raise ValueError("the state contains NaN or inf; check the observation and the state normaliser")
        self.stats.state_clipped += int(((state < -1.0) | (state > 1.0)).sum())
        return np.clip(state, -1.0, 1.0)

    def state_bins_of(self, state: np.ndarray) -> np.ndarray:
        """Normalised state ``[S]`` -> ints in ``[0, state_bins)`` (openpi's ``np.digitize``), clipping counted."""
        return np.digitize(self.clipped_state(state), self._edges) - 1

    def prefix_text_ids(self, task: str, state: np.ndarray, *, checked: bool = False) -> list[int]:
        """``BOS "Task: {task}, State: {s};\\n"`` as ids, cutting the task (logged) if it does not fit.

        With ``state_encoding="embedding"`` the state is ``state_tokens`` slots, written as ``-1`` here; an empty state
        (``[0]``, a policy without state) leaves out ``", State: ..."`` altogether. ``checked``: the caller has
        already checked and counted this state (``clipped_state``), so it is not counted twice.
        """
        task = clean_task(task)
        encode = self.vocab.text.encode
        if len(state) == 0:  # no state (an image-only policy): BOS "Task: {task};\n", no state slot

            def render(task: str) -> list[int]:
                return [self.vocab.text.bos_id, *encode(f"Task: {task};\n")]
        elif self.state_encoding == "text":
            state_text = " ".join(str(int(b)) for b in self.state_bins_of(state))

            def render(task: str) -> list[int]:
                return [self.vocab.text.bos_id, *encode(f"Task: {task}, State: {state_text};\n")]
        else:
            if not checked:
                self.clipped_state(state)  # checked and counted here; _pack stores the clipped values
            slots, tail = [_STATE_SLOT] * self.state_tokens, encode(";\n")

            def render(task: str) -> list[int]:
                return [self.vocab.text.bos_id, *encode(f"Task: {task}, State: "), *slots, *tail]

        ids = render(task)
        if len(ids) <= self.max_prefix_len:
            return ids
        bare = len(render(""))
        if bare > self.max_prefix_len:
            raise ValueError(
                f"the prompt needs {bare} text tokens for a {len(state)}-D state alone, more than max_prefix_len "
                f"{self.max_prefix_len}; raise max_prefix_len to at least {bare + 32}"
            )
        original = task
        while len(ids) > self.max_prefix_len:  # cut whole characters until it fits (exact for bytes)
            task = task[: max(0, len(task) - max(1, len(ids) - self.max_prefix_len))]
            ids = render(task)
        self.stats.tasks_truncated += 1
        logger.warning(
            "task %r is too long for max_prefix_len %d: cut to %r (%d truncations so far); raise max_prefix_len "
            "to keep whole tasks",
            original,
            self.max_prefix_len,
            task,
            self.stats.tasks_truncated,
        )
        return ids

    def prefix_ids(self, task: str, state: np.ndarray) -> list[int]:
        """The whole prefix of one sample: image placeholders, then the text."""
        return [self.vocab.text.image_id] * self.num_image_tokens + self.prefix_text_ids(task, state)

    def _prefix_rows(self, tasks: list[str], states: np.ndarray) -> list[list[int]]:
        """``prefix_ids`` of every row of a checked batch. Where the ids do not depend on the state's values (state
        slots, or no state) each task's are built once and reused; the state is still checked and its clipping
        counted, batch-wide, exactly as row by row."""
        fixed = states.shape[1] == 0 or self.state_encoding == "embedding"
        if not fixed or len(self._prefixes) > 4096:  # a state as text varies row by row (as would a stream of tasks)
            return [self.prefix_ids(t, s) for t, s in zip(tasks, states)]
        if states.shape[1]:
            self.clipped_state(states)  # checked and counted, as prefix_text_ids does per row
        images, rows = [self.vocab.text.image_id] * self.num_image_tokens, []
        for task, state in zip(tasks, states):
            key = (task, len(state))
            ids = self._prefixes.get(key)
            if ids is None:
                cut = self.stats.tasks_truncated
                ids = images + self.prefix_text_ids(task, state, checked=True)
                if self.stats.tasks_truncated == cut:  # a cut task is cut (and logged) again every time
                    self._prefixes[key] = ids
            rows.append(ids)
        return rows

    def suffix_ids(self, action_ids: list[int] | np.ndarray) -> list[int]:
        """``"Action: "`` + action ids mapped into the vocabulary + ``"|"`` + EOS."""
        mapped = self.vocab.action_to_vocab(np.asarray(action_ids, dtype=np.int64)).tolist()
        return [*self.vocab.marker_ids, *mapped, self.vocab.end_id, self.vocab.text.eos_id]

    # --- batches -------------------------------------------------------------------------------------------
    def build_prefix(self, tasks: list[str], states: np.ndarray, *, with_marker: bool = True) -> Sequence:
        """Inference prompts, left-padded: ``[pad..][prefix]["Action: "]`` per row (parallel: ``[prefix][slots]``).

        ``"Action: "`` opens the suffix (causal) but never varies, so it is fed with the prompt rather than
        sampled; the first generated token is the first action id.
        """
        states = self._check_batch(tasks, states)
        if self.decoding == "parallel":
            suffix = [_QUERY_SLOT] * self.num_slots
        else:
            suffix = list(self.vocab.marker_ids) if with_marker else []
        rows = [(prefix, suffix) for prefix in self._prefix_rows(tasks, states)]
        return self._pack(rows, states, pad_left=True)

    def build_training_sequence(self, tasks: list[str], states: np.ndarray, action_ids: list[list[int]]) -> Sequence:
        """Training rows, right-padded: ``[prefix][Action: a_1..a_n | EOS][pad..]``, loss on the suffix.

        Parallel: ``[prefix][q_1..q_n][pad..]``, slot ``i``'s target action id ``a_i``, loss on the slots only.
        """
        states = self._check_batch(tasks, states)
        if len(action_ids) != len(tasks):
            raise ValueError(f"{len(action_ids)} action id rows for {len(tasks)} tasks; pass one row per sample")
        if self.decoding == "parallel":
            lengths = sorted({len(a) for a in action_ids} - {self.num_slots})
            if lengths:
                raise ValueError(
                    f"parallel decoding has {self.num_slots} slots per chunk but got chunks of {lengths} ids: the "
                    "tokenizer is not fixed-length; use decoding='autoregressive' or a bin/fsq/beast tokenizer"
                )
            rows = [(prefix, [_QUERY_SLOT] * self.num_slots) for prefix in self._prefix_rows(tasks, states)]
            return self._pack(rows, states, pad_left=False, slot_targets=action_ids)
        rows = [(prefix, self.suffix_ids(a)) for prefix, a in zip(self._prefix_rows(tasks, states), action_ids)]
        return self._pack(rows, states, pad_left=False)

    def _check_batch(self, tasks: list[str], states: np.ndarray) -> np.ndarray:
        if isinstance(tasks, str):
            raise ValueError("tasks must be a list of strings, one per sample; wrap a single task as [task]")
        states = np.asarray(states, dtype=np.float64)
        if states.ndim != 2:
            raise ValueError(f"states must be [B, S], got shape {states.shape}")
        if len(tasks) != len(states):
            raise ValueError(f"{len(tasks)} tasks for {len(states)} states; pass one task per sample")
        return states

    def _pack(
        self,
        rows: list[tuple[list[int], list[int]]],
        states: np.ndarray,
        pad_left: bool,
        slot_targets: list[list[int]] | None = None,
    ) -> Sequence:
        """Rows of (prefix ids, suffix ids) and their normalised states -> one padded ``Sequence``.

        ``slot_targets``: parallel training rows, the action ids the query slots predict (one per slot)."""
        pad = self.vocab.text.pad_id
        b = len(rows)
        prefix_lens = np.fromiter((len(p) for p, _ in rows), dtype=np.int64, count=b)
        lengths = prefix_lens + np.fromiter((len(s) for _, s in rows), dtype=np.int64, count=b)
        width = int(lengths.max())
        start = width - lengths if pad_left else np.zeros(b, dtype=np.int64)  # [B] each row's first column
        column = np.arange(width)
        valid_np = (column >= start[:, None]) & (column < (start + lengths)[:, None])  # [B, L]
        ids_np = np.full((b, width), pad, dtype=np.int64)
        # every row's tokens are contiguous and in order, so the row-major True cells take the rows' ids in turn
        ids_np[valid_np] = np.fromiter(
            itertools.chain.from_iterable(p + s for p, s in rows), dtype=np.int64, count=int(lengths.sum())
        )
        input_ids, valid = torch.from_numpy(ids_np), torch.from_numpy(valid_np)
        in_suffix = torch.from_numpy(valid_np & (column >= (start + prefix_lens)[:, None]))
        # Every token with ar = 1 opens its own causal block: the suffix's (prefix-LM), or every valid one (causal).
        ar = (in_suffix if self.attention == "prefix_lm" else valid).long()
        state_slots = input_ids == _STATE_SLOT
        input_ids[state_slots] = pad  # never embedded: the model writes the state's embedding there
        query_slots = input_ids == _QUERY_SLOT
        input_ids[query_slots] = pad  # never embedded: the model writes each slot's learned embedding there
        if bool(query_slots.any()):  # only the first slot opens a block: the slots see each other, the prefix none
            first = query_slots & ~torch.nn.functional.pad(query_slots[:, :-1], (1, 0))
            ar = torch.where(query_slots, first.long(), ar)
        position_ids = (torch.cumsum(valid.long(), dim=1) - 1).clamp(min=0) * valid
        # Position i predicts token i + 1; it counts in the loss when token i + 1 is a (valid) suffix token.
        targets = torch.full_like(input_ids, pad)
        targets[:, :-1] = input_ids[:, 1:]
        target_in_suffix = torch.zeros_like(valid)
        target_in_suffix[:, :-1] = in_suffix[:, 1:] & valid[:, 1:]
        action_mask = target_in_suffix & self.vocab.is_action(targets)
        targets = torch.where(target_in_suffix, targets, pad)
        if self.decoding == "parallel":  # a slot predicts its own action id, in place; nothing else is a target
            targets = torch.full_like(input_ids, pad)
            target_in_suffix = torch.zeros_like(valid)
            if slot_targets is not None:
                flat = np.concatenate([np.asarray(a, dtype=np.int64) for a in slot_targets])
                targets[query_slots] = torch.as_tensor(self.vocab.action_to_vocab(flat))  # row-major, as the slots
                target_in_suffix = query_slots.clone()
            action_mask = target_in_suffix.clone()
        prefix_len = torch.from_numpy(prefix_lens)
        state = torch.as_tensor(np.clip(states, -1.0, 1.0), dtype=torch.float32)  # clipped as the text path is
        return Sequence(
            input_ids,
            valid,
            ar,
            position_ids,
            targets,
            target_in_suffix,
            action_mask,
            prefix_len,
            state,
            state_slots,
            query_slots,
        )
