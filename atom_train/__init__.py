"""atom: a batched trainer for byte-level recurrent field language models."""

__version__ = "0.1.0"
