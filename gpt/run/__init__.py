"""One run on disk and on devices: the run folder and its file names (``directory``: the lock, the summary,
evaluation results, which checkpoint), its lock (``lock``), checkpoints (``checkpoints``), the processes and devices
(``distributed``), precision / compile / TF32 as they apply (``fastpath``), the fingerprint of each
segment (``fingerprint``), the random states (``random_state``), a run's bookkeeping beside the training step
(``ledger``: claim, fingerprint, length check, summary, the end) and whether this machine can train at all
(``machine``: GPUs, torch.compile, all-reduce; the GPU preflight).

May import: ``gpt.common``, ``gpt.config``, ``gpt.model``, ``gpt.data``.
"""
