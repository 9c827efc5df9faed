"""Sample text from a checkpoint or a Hub repo published by push_to_hub, on the CPU or a GPU.

    python scripts/generate.py CHECKPOINT_OR_REPO --prompt "..." [--max-new-tokens 100]
                               [--temperature 0.8] [--top-k 50] [--seed 0] [--which final|best|latest]
                               [--revision BRANCH] [--device auto|cpu|cuda] [--num-samples 1]
    python -m gpt.commands.generate ...   /   gpt-generate ...

A local run directory or checkpoint folder is read as it is; anything else is taken as a
Hub repository (USER/NAME, downloaded into the Hugging Face cache). The same seed gives
the same text. --temperature 0 takes the most likely token at every step.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from gpt.commands.cli import command, parser_for


def load_model(source: str, which: str, revision: str | None):
    """Our GPT from a run / checkpoint on disk, or from a Hub repo (either published layout), and the name of
    its tokenizer: a checkpoint's is the one its token set was made with; a published model's is gpt2."""
    from gpt.common.errors import UserError, first_line
    from gpt.data.tokenizer import OFFLINE
    from gpt.model.gpt import GPT
    from gpt.publish.layouts import load_published
    from gpt.run.checkpoints import checkpoint_config, checkpoint_tokenizer, load_weights
    from gpt.run.directory import resolve_which

    if Path(source).exists():
        if (Path(source) / "config.json").is_file():  # an export folder (a downloaded repo)
            return load_published(Path(source)), "gpt2"
        ckpt = resolve_which(source, which)
        model = GPT(checkpoint_config(ckpt).model)
        load_weights(model, ckpt)
        tokenizer = checkpoint_tokenizer(ckpt)
        return model.eval(), tokenizer if tokenizer in OFFLINE else "gpt2"
    from huggingface_hub import snapshot_download

    try:
        folder = snapshot_download(source, revision=revision, allow_patterns=["config.json", "model.safetensors"])
    except Exception as e:  # noqa: BLE001  offline, unknown repo, no access: the library's first line
        raise UserError(
            f"{source}: not a local run or checkpoint, and not a Hub repo that can be fetched: {first_line(e)}"
        ) from None
    return load_published(Path(folder)), "gpt2"


def build_parser() -> argparse.ArgumentParser:
    """The command's arguments (``--help`` shows them)."""
    parser = parser_for(__doc__, 2)
    parser.add_argument("source", metavar="CHECKPOINT_OR_REPO")
    parser.add_argument("--prompt", default="", help="text to continue (default: from <|endoftext|>)")
    parser.add_argument("--max-new-tokens", type=int, default=100)
    parser.add_argument("--temperature", type=float, default=0.8)
    parser.add_argument("--top-k", type=int, default=50, help="sample among the k most likely tokens (0: all)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--num-samples", type=int, default=1)
    parser.add_argument("--which", choices=("final", "best", "latest"), default="final")
    parser.add_argument("--revision", help="Hub branch, tag or commit (default main)")
    parser.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto")
    return parser


@command
def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from gpt.common.errors import UserError

    if args.max_new_tokens < 1 or args.temperature < 0 or args.top_k < 0 or args.num_samples < 1:
        raise UserError("--max-new-tokens and --num-samples must be >= 1, --temperature and --top-k >= 0")
    import torch  # after the arguments are known good

    from gpt.data.tokenizer import get_tokenizer
    from gpt.run.distributed import pick_device

    device = pick_device(args.device)
    model, tokenizer = load_model(args.source, args.which, args.revision)
    model = model.to(device)
    enc = get_tokenizer(tokenizer)
    ids = enc.encode(args.prompt, allowed_special="all") or [enc.eot_token]
    if max(ids) >= model.cfg.vocab_size:
        raise UserError(f"the prompt has token {max(ids)}, beyond this model's vocabulary of {model.cfg.vocab_size}")
    idx = torch.tensor([ids] * args.num_samples, device=device)
    g = torch.Generator(device=device).manual_seed(args.seed)
    out = model.generate(idx, args.max_new_tokens, temperature=args.temperature, top_k=args.top_k or None, generator=g)
    for i, row in enumerate(out.tolist()):
        if i:
            print("-" * 40)
        print(enc.decode(row))
    return 0


if __name__ == "__main__":
    sys.exit(main())
