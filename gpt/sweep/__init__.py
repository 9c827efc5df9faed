"""The sweep: a grid of norm types x seeds as runs. Its layout, every cell's name, seeds and
validated config (``cells``); training, resuming and evaluating the cells, then comparing them and
publishing the whole (``launch``).

May import: the wings up to ``gpt.analysis``.
"""
