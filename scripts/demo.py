"""The embedded demo, for now: build the tiny model for every norm type and train it a
few steps on random tokens on the CPU, from the same seed.

    python scripts/demo.py [--config configs/tiny.yaml] [--steps 10]

It shows that every norm type builds, runs forward and backward, and learns (the same
few random sequences are shown again and again, so the loss must fall well below
ln(vocab)), and that the hand-rolled and PyTorch versions of a norm start from the
same loss because they start from the same weights. Real data and a held-out test
loss come with the data, trainer and evaluation issues.
"""

import argparse
import math
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from gpt.config import ConfigError, load_config  # noqa: E402
from gpt.model import GPT  # noqa: E402
from gpt.norms import NORM_TYPES  # noqa: E402


def train_on_random_tokens(cfg, steps: int, n_sequences: int = 32) -> dict:
    """Train ``steps`` AdamW steps on a fixed pool of random sequences; losses and speed."""
    model = GPT(cfg.model, seed=cfg.init_seed)
    g = torch.Generator().manual_seed(cfg.train.seed)
    T = cfg.model.context_length
    pool = torch.randint(0, cfg.model.vocab_size, (n_sequences, T + 1), generator=g)
    o = cfg.optim
    opt = torch.optim.AdamW(model.parameters(), lr=o.lr, betas=(o.beta1, o.beta2), eps=o.eps,
                            weight_decay=o.weight_decay)
    B = cfg.train.micro_batch_size
    losses = []
    start = time.perf_counter()
    for step in range(steps):
        rows = torch.arange(step * B, (step + 1) * B) % n_sequences
        batch = pool[rows]
        _, loss = model(batch[:, :-1], batch[:, 1:])  # predict token t+1 from tokens <= t
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    seconds = time.perf_counter() - start
    return {"params": model.num_params(), "first": losses[0], "last": losses[-1],
            "tokens_per_s": steps * B * T / seconds}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default=str(Path(__file__).resolve().parents[1] / "configs" / "tiny.yaml"))
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--norm-types", nargs="+", default=list(NORM_TYPES), metavar="NORM_TYPE")
    args = parser.parse_args()
    try:
        cfgs = [load_config(args.config, [f"model.norm_type={t}"]) for t in args.norm_types]
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    torch.manual_seed(0)
    m = cfgs[0].model
    print(f"{args.steps} steps on random tokens, {m.n_layers} layers x {m.d_model}, vocab {m.vocab_size}, "
          f"context {m.context_length}, seed {cfgs[0].init_seed}; ln(vocab) = {math.log(m.vocab_size):.3f}")
    print(f"{'norm_type':<28}{'params':>12}{'first loss':>12}{'last loss':>11}{'tokens/s':>10}")
    for cfg in cfgs:
        r = train_on_random_tokens(cfg, args.steps)
        print(f"{cfg.model.norm_type:<28}{r['params']:>12,}{r['first']:>12.4f}{r['last']:>11.4f}"
              f"{r['tokens_per_s']:>10,.0f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
