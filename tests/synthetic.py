"""Test data and configs made on the spot, with no pytest needed (tests/speed/test_cuda.py runs without it too)."""

import contextlib
import hashlib
import json
from pathlib import Path

import numpy as np

from gpt.data.tokens import sample_digest

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = ROOT / "configs"
VOCAB = 256


def write_meta(folder, n_vocab, record_splits=False):
    """The meta.json prepare_data writes last: the reader takes a .bin set only with it. With
    ``record_splits``, each split's token count, sha256 and sampled sha256, as prepare_data records them."""
    splits = (
        {
            p.stem: {
                "file": p.name,
                "tokens": p.stat().st_size // 2,
                "sha256": hashlib.sha256(p.read_bytes()).hexdigest(),
                "sampled_sha256": sample_digest(p),
            }
            for p in sorted(Path(folder).glob("*.bin"))
        }
        if record_splits
        else {}
    )
    (folder / "meta.json").write_text(
        json.dumps(
            {
                "dtype": "uint16",
                "tokenizer": {"name": "synthetic", "n_vocab": n_vocab},
                **({"splits": splits} if splits else {}),
            }
        )
    )


def write_token_set(folder, n_train=200_000, n_val=20_000, n_test=20_000, seed=0):
    """A learnable synthetic token set over 256 tokens: each token mostly follows from the one before."""
    rng = np.random.default_rng(seed)
    folder.mkdir(parents=True, exist_ok=True)
    for split, n in (("train", n_train), ("val", n_val), ("test", n_test)):
        noise = rng.integers(0, VOCAB, n)
        follow = rng.random(n) < 0.8
        tokens = np.empty(n, dtype=np.uint16)
        tokens[0] = noise[0]
        for i in range(1, n):  # 80%: (7 * previous + 3) mod 256, else random
            tokens[i] = (7 * int(tokens[i - 1]) + 3) % VOCAB if follow[i] else noise[i]
        (folder / f"{split}.bin").write_bytes(tokens.tobytes())
    write_meta(folder, VOCAB, record_splits=True)
    return folder


def write_train_yaml(folder: Path, token_set: Path, name: str = "run", device: str = "cpu") -> Path:
    """A tiny training config (vocab 256, fp32, 20 steps) writing into folder/name."""
    text = f"""
run: {{name: {name}, dir: {folder / name}, device: {device}}}
model: {{vocab_size: {VOCAB}, context_length: 32, d_model: 32, n_layers: 2, n_heads: 2, norm_type: pytorch_layernorm}}
data: {{path: {token_set}, val_tokens: 2048}}
optim: {{lr: 1.0e-2, min_lr: 1.0e-3, warmup_frac: 0.1}}
train: {{seed: 0, micro_batch_size: 4, global_batch_size: 8, steps: 20, precision: fp32,
         eval_every: 10, checkpoint_every: 10, keep_last: 5}}
log: {{log_every: 1, progress: false}}
"""
    path = folder / f"{name}.yaml"
    path.write_text(text)
    return path


def sized_grid_yaml(config: Path, steps: int, checkpoint_every: int, eval_every: int) -> Path:
    """``write_train_yaml``'s config, rewritten in place for a sweep's cells: their length, checkpoints and
    validations, and a test split of 4096 tokens (so that every cell is evaluated quickly)."""
    text = config.read_text().replace("steps: 20", f"steps: {steps}")
    text = text.replace("checkpoint_every: 10", f"checkpoint_every: {checkpoint_every}")
    text = text.replace("eval_every: 10", f"eval_every: {eval_every}")
    config.write_text(text.replace("data: {path:", "data: {test_tokens: 4096, path:"))
    return config


SYNC_PERMITTED = ("first_step", "log_record", "read_stats", "check_divergence", "validate", "checkpoint", "finish")


@contextlib.contextmanager
def no_sync_between_log_steps(get_mode=None, set_mode=None):
    """Within it, any CUDA synchronisation a training run makes between its permitted points raises.

    CUDA's sync debug mode is "error" from the start of every step but the first (which may
    wait: it creates the optimizer state) until the next call of a permitted method (log,
    divergence counters, validation, checkpoint, the end), which run in mode 0 and put back
    the mode they found. A run's end leaves mode 0, so the next run's setup (its model's copy
    to the GPU blocks) is not checked. ``get_mode`` / ``set_mode``: torch.cuda's, unless given
    (a CPU test fakes them).
    """
    import torch

    from gpt.run.distributed import Dist
    from gpt.training.loop import Trainer

    get_mode = get_mode or torch.cuda.get_sync_debug_mode
    set_mode = set_mode or torch.cuda.set_sync_debug_mode
    originals = {name: getattr(Trainer, name) for name in (*SYNC_PERMITTED, "train_step", "train")}
    sync = Dist.synchronize

    def permitted(fn):
        def call(*args, **kw):
            mode = get_mode()
            set_mode(0)
            try:
                return fn(*args, **kw)
            finally:
                set_mode(mode)

        return call

    def strict_step(self):
        if self.first_step_seconds is not None:
            set_mode("error")  # from here to the next permitted call
        return originals["train_step"](self)

    def whole_run(self):
        try:
            return originals["train"](self)
        finally:
            set_mode(0)  # the end of a run: what comes next (another run's setup) may wait for the GPU

    for name in SYNC_PERMITTED:
        setattr(Trainer, name, permitted(originals[name]))
    Trainer.train_step, Trainer.train, Dist.synchronize = strict_step, whole_run, permitted(sync)
    try:
        yield
    finally:
        set_mode(0)
        for name, fn in originals.items():
            setattr(Trainer, name, fn)
        Dist.synchronize = sync


def checkpoint(cfg, model) -> Path:
    """A checkpoint folder of ``model`` (step 10) as a run of ``cfg`` writes it: weights, config, record."""
    from gpt.config import dump_config
    from gpt.run.checkpoints import save_checkpoint

    info = {"step": 10, "tokens": 100, "segments": []}
    root = cfg.run_dir / "checkpoints"
    return save_checkpoint(
        root, 10, model, state={}, config_yaml=dump_config(cfg), info=info, keep_last=1, is_best=False
    )
