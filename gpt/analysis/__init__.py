"""Runs side by side: statistics (``stats``), the variance components of crossed seeds (``variance``), the
runs a comparison reads (``runs``), the refusal of runs differing in more than the norm (``comparable``), the
groups and the baseline (``grouping``), each group's numbers (``summary``), the comparison from runs to its files
(``table``), each norm type's learning rate chosen on validation (``selection``), its markdown (``report``),
every chart (``charts``), and what each norm does inside the model read back from ``stats.jsonl`` (``inside``).

May import: the wings up to ``gpt.publish``.
"""
