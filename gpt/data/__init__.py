"""Tokens: the GPT-2 tokenizer built offline (``tokenizer``), corpora (``sources``), preparing token files
(``encode``) and reading them (``tokens``: token files, ranges, the training batches, meta.json).

May import: ``gpt.common``, ``gpt.config``, ``gpt.model``.
"""
