"""Publish a checkpoint on the Hugging Face Hub, loadable with transformers.

    python scripts/push_to_hub.py RUN_OR_CHECKPOINT --repo USER/NAME [--which final|best|latest]
                                  [--private | --public] [--revision BRANCH] [--native-gpt2]
    python -m gpt.commands.push_to_hub ...   /   gpt-push-to-hub ...

Uploads, in one commit: model.safetensors, config.json, the modelling code (every norm
type; AutoModelForCausalLM.from_pretrained(repo, trust_remote_code=True)) or, with
--native-gpt2, the stock GPT2LMHeadModel layout (pre-norm LayerNorm models without QK-norm
only), the GPT-2 tokenizer files, the model card with the test loss evaluate.py wrote, and
loss.png. The token comes from HF_TOKEN or `hf auth login`, and is written nowhere. A failed upload is
retried with backoff, then reported in one line (exit status 2); nothing local changes.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from gpt.commands.cli import command, parser_for


def build_parser() -> argparse.ArgumentParser:
    """The command's arguments (``--help`` shows them)."""
    parser = parser_for(__doc__, 2)
    parser.add_argument("path", metavar="RUN_OR_CHECKPOINT", help="a run directory or a checkpoint folder")
    parser.add_argument("--repo", required=True, metavar="USER/NAME", help="the Hub repository (created if needed)")
    parser.add_argument(
        "--which",
        choices=("final", "best", "latest"),
        default="final",
        help="which checkpoint of a run (default final: the end of a completed run)",
    )
    privacy = parser.add_mutually_exclusive_group()
    privacy.add_argument(
        "--private",
        dest="private",
        action="store_true",
        default=True,
        help="create the repository as private (the default)",
    )
    privacy.add_argument("--public", dest="private", action="store_false", help="create it as public")
    parser.add_argument("--revision", metavar="BRANCH", help="upload to this branch (created if needed; default main)")
    parser.add_argument(
        "--native-gpt2",
        action="store_true",
        help="the stock GPT2LMHeadModel layout, no remote code (pre-norm LayerNorm models without QK-norm only)",
    )
    parser.add_argument(
        "--comparison",
        metavar="FILE",
        type=Path,
        help="a comparison.json holding the run (default: one beside the run, if any)",
    )
    return parser


@command
def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from gpt.common.errors import UserError
    from gpt.config.schema import HubConfig
    from gpt.run.directory import RunDir, resolve_which

    problems: list[str] = []
    HubConfig(repo_id=args.repo).validate(lambda key, message: problems.append(f"--repo: {message}"))
    if problems:
        raise UserError(problems[0])
    ckpt = resolve_which(args.path, args.which)
    from gpt.common.files import read_json  # the heavy imports, after the arguments are known good
    from gpt.publish.export import comparison_row
    from gpt.publish.layouts import Layout
    from gpt.publish.uploads import push

    comparison = None
    if args.comparison is not None:
        run = RunDir.of_checkpoint(ckpt)
        comparison = comparison_row(read_json(args.comparison, "comparison"), run)
        if comparison is None:
            raise UserError(f"{args.comparison}: holds no group with the run {run.path.resolve()}")
    commit, files = push(
        ckpt,
        args.repo,
        layout=Layout.NATIVE_GPT2 if args.native_gpt2 else Layout.REMOTE_CODE,
        private=args.private,
        revision=args.revision,
        comparison=comparison,
    )
    print(
        json.dumps(
            {
                "repo": args.repo,
                "revision": args.revision or "main",
                "commit": commit,
                "checkpoint": str(ckpt),
                "files": files,
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
