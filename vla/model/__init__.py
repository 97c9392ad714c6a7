"""The prefix-LM: the sequence layout and its mask, the task text, the vision towers, the backbone
(``prefix_lm.PrefixLM``) with its lean training and decoding steps, and constrained decoding."""
