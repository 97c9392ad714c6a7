"""vla: a PaliGemma-style prefix-LM policy over discrete action tokens, and everything around it.

The action tokenizers live in the separate package ``action_tokenizers``; ``vla`` imports it, never the reverse.
"""

__version__ = "0.1.0"
