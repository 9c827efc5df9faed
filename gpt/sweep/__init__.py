"""The sweep: a grid of norm types x seeds (x learning rates) as runs. Its layout, every cell's name, seeds and
validated config (``cells``) and the sweep's definition as its command line gives it (``spec``);
training, resuming and evaluating the cells here, then comparing them and publishing the whole
(``launch``); or as SLURM jobs: the job scripts, submission and status (``slurm``), the calls to
the SLURM controller (``controller``) and what runs inside a job (``cell_job``).

May import: the wings up to ``gpt.analysis``.
"""
