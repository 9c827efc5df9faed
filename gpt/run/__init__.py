"""One run on disk and on devices: the run folder and its file names (``directory``: the lock, the summary,
evaluation results, which checkpoint), its lock (``lock``), checkpoints (``checkpoints``), the processes and devices
(``distributed``), precision / compile / TF32 as they apply (``fastpath``), the fingerprint of each
segment (``fingerprint``) and the random states (``random_state``).

May import: ``gpt.common``, ``gpt.config``, ``gpt.model``, ``gpt.data``.
"""
