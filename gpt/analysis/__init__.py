"""Runs side by side: statistics (``stats``), the comparison table that refuses runs differing in more
than the norm (``table``), each norm type's learning rate chosen on validation (``selection``), its markdown
(``report``), every chart (``charts``), and what each norm does inside the model read back from ``stats.jsonl``
(``inside``).

May import: the wings up to ``gpt.publish``.
"""
