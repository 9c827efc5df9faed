"""Training a run: the loop (``loop``: ``Trainer`` and ``train``; the run's bookkeeping is
``gpt.run.ledger``'s), the model, optimizer and one optimizer step that runs, benchmarks and memory probes share
(``step``: ``StepEngine``), the optimizer and its weight-decay groups (``optimizer``), the learning-rate
schedules (``schedule``), stop signals, divergence and throughput (``monitors``), what each norm does
inside the model and its early warning (``inside``), metrics.jsonl, stats.jsonl and wandb (``metrics``),
and ``hooks``: how a run tells the world outside it (charts, uploads) without
knowing it.

May import: the wings up to ``gpt.evaluation``; never ``gpt.speed``, ``gpt.publish`` or ``gpt.analysis``
(those time its step, or reach a run through the hooks the command hands it).
"""
