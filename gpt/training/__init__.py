"""Training a run: the loop (``loop``: ``Trainer`` and ``train``), the optimizer and its weight-decay
groups (``optimizer``), the learning-rate schedules (``schedule``), stop signals, divergence and
throughput (``monitors``), metrics.jsonl and wandb (``metrics``), and ``hooks``: how a run tells
the world outside it (charts, uploads) without knowing it.

May import: the wings up to ``gpt.evaluation``; never ``gpt.publish`` or ``gpt.analysis`` (those reach
a run through the hooks the command hands it).
"""
