"""Speed: how fast a training step runs and what fits on a GPU. Timing real training steps, single norm
layers and generation (``timing``), the rows as ``bench.py`` prints and appends them (``rows``), step-time
statistics, MFU and the chips' peaks (``mfu``), the largest micro-batch that fits in GPU memory
(``micro_batch``: ``train.py --find-micro-batch``), and the GPU check: a budgeted run of stages
(``stages``), what a run of tests reached (``progress_plugin``, a pytest plugin) and the check's own stages,
budget and summary (``gpu_check``).

May import: the wings up to ``gpt.training`` (it times the trainer's own step); never ``gpt.publish`` or
``gpt.analysis``.
"""
