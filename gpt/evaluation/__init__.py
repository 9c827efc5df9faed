"""Scoring a model on held-out tokens: the loss over a token range on any number of processes
(``token_loss``, also the trainer's validation), the test loss of a checkpoint or of a
transformers GPT-2, kept beside the checkpoint (``held_out``), HellaSwag (``hellaswag``), and
the registry of the tasks evaluate.py runs, which the comparison, the report and the model card
read too (``tasks``; what a task is: ``declaration``).

May import: the wings up to ``gpt.run``.
"""
