"""The network: ``gpt`` (the GPT-2-style decoder), ``norms`` (``make_norm``, every norm layer), ``loss``
(the one cross-entropy and the autocast choice), ``gpt2_weights`` (to and from transformers' GPT-2),
``inventory`` (what a config builds, in words).

``gpt``, ``norms`` and ``loss`` are shipped verbatim to the Hub, where the published model's
remote code wraps this very GPT: they import torch and each other (relatively) only.
May import: ``gpt.common``, ``gpt.config`` (not the three shipped files).
"""
