"""Scoring a model on held-out tokens: the loss over a token range on any number of processes
(``token_loss``, also the trainer's validation), the test loss of a checkpoint or of a
transformers GPT-2, kept beside the checkpoint (``test_loss``), HellaSwag (``hellaswag``), and
the tasks evaluate.py runs behind one interface (``tasks``).

May import: the wings up to ``gpt.run``.
"""
