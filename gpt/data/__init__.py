"""Tokens: the GPT-2 tokenizer built offline (``tokenizer``), corpora (``sources``), preparing token files
(``encode``), reading them (``tokens``: token files, ranges, meta.json), finding a set's folder and opening its
splits (``folders``), and the order of the training batches (``batches``).

May import: ``gpt.common``, ``gpt.config``, ``gpt.model``.
"""
