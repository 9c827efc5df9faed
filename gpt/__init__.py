"""gpt-norm-harness: train GPT-2-style models that differ in their norm layer, and compare them.

One folder per concern (a *wing*), lowest first; a module imports only from its own wing and
the wings above it in this list (``tests/behaviour/test_architecture.py`` holds the code to it):

    common/      errors every wing raises, time-bounded calls
    config/      the typed run configuration and its YAML (no torch)
    model/       the GPT, its norms, its loss (the files the Hub gets verbatim), GPT-2 weights
    data/        tokenizer, corpora, token files and the batches read from them
    run/         one run on disk and on devices: run folder, checkpoints, fingerprint, processes
    evaluation/  scoring a model: held-out loss (validation and test), HellaSwag, the tasks evaluate.py runs
    training/    the training loop, optimizer, schedule, monitors, metrics, and its hooks
    publish/     a checkpoint as a Hub repository: layouts, card, export, uploads; a whole sweep; lm-eval
    analysis/    comparison of runs: statistics, tables, charts, the sweep, speed benchmarks
    commands/    the front doors: one module per command, each thin

The README's "Layout" section draws the same map with every module.
"""
