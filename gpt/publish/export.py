"""A checkpoint as a Hub repository's files: weights, config, tokenizer, model card, loss curve.

An export folder holds ``model.safetensors``, a ``config.json``, the GPT-2 tokenizer files
(``vocab.json``, ``merges.txt``, from the same offline BPE files as ``gpt.data.tokenizer``),
the model card ``README.md`` and the loss curve, in one of the two layouts of
``gpt.publish.layouts``.
"""

from __future__ import annotations

from pathlib import Path

from safetensors.torch import save_file

from gpt.common.errors import UserError, quoted
from gpt.common.files import copy_atomically, read_json, replacing, write_atomically, write_json
from gpt.config import Config
from gpt.data.tokenizer import OFFLINE, gpt2_files_dir
from gpt.data.tokens import read_meta
from gpt.evaluation.tasks import TASKS
from gpt.publish.card import CardFacts, card_text
from gpt.publish.layouts import Layout, export_weights, hub_config, read_weights, write_code
from gpt.run.checkpoints import MODEL_FILE, checkpoint_config, checkpoint_tokenizer, read_info
from gpt.run.directory import Evaluations, RunDir, comparisons_beside

EOT = "<|endoftext|>"


def write_tokenizer(folder: Path, context_length: int) -> list[str]:
    """GPT-2's tokenizer files, from the offline BPE files (encoder.json -> vocab.json, vocab.bpe -> merges.txt)."""
    src = gpt2_files_dir()
    copy_atomically(src / "encoder.json", folder / "vocab.json")
    copy_atomically(src / "vocab.bpe", folder / "merges.txt")
    write_json(
        folder / "tokenizer_config.json",
        {
            "tokenizer_class": "GPT2Tokenizer",
            "model_max_length": context_length,
            "add_prefix_space": False,
            "bos_token": EOT,
            "eos_token": EOT,
            "unk_token": EOT,
            "pad_token": EOT,  # a batch of prompts pads on the left with it; the attention mask hides it
            "padding_side": "left",
        },
    )
    write_json(
        folder / "special_tokens_map.json", {"bos_token": EOT, "eos_token": EOT, "unk_token": EOT, "pad_token": EOT}
    )
    return ["vocab.json", "merges.txt", "tokenizer_config.json", "special_tokens_map.json"]


def card_facts(
    ckpt: Path,
    cfg: Config,
    repo_id: str,
    n_params: int,
    run: RunDir,
    summary: dict | None,
    comparison: dict | None,
    layout: Layout,
    experiment: dict | None = None,
    evaluations: Evaluations | None = None,
) -> CardFacts:
    """What the card says of ``ckpt``: its info, the run's summary and charts, its test loss and tasks
    (``evaluations``: its results as the caller read them; by default read here)."""
    info = read_info(ckpt)
    evaluations = evaluations or Evaluations(ckpt)
    evaluation = next((e for p in ("fp32", "bf16", "fp16") if (e := evaluations.result("test", p))), None)
    meta = read_meta(cfg.data.path) if cfg.data.path else None
    source = (meta or {}).get("source")  # prepare_data's description: a Hub data set's repo, or a name
    if isinstance(source, dict):
        source = source.get("repo") or source.get("name")
    return CardFacts(
        repo_id=repo_id,
        n_params=n_params,
        step=info.get("step"),
        best=bool(info.get("weights_only")),  # a best-<step> folder: the best validation's weights alone
        tokens=info.get("tokens"),
        val_loss=info.get("val_loss"),
        summary=summary if summary is not None else run.summary(),
        evaluation=evaluation,
        # a sweep published whole shows its row, not the group's (which changes as seeds are added)
        comparison=comparison if comparison is not None or experiment is not None else row_in_comparison_beside(run),
        data_source=source if isinstance(source, str) else None,
        layout=layout,
        loss_png=run.loss_chart.is_file(),
        tasks={
            t.name: r for t in TASKS.values() if t.card is not None and (r := evaluations.result(t.name)) is not None
        },
        experiment=experiment,
    )


def comparison_row(result: dict, run: RunDir) -> dict | None:
    """The group of a comparison result (comparison.json) that holds ``run``, with the baseline's name."""
    for group in result.get("groups", []):
        if any(Path(r.get("path", "")).resolve() == run.path.resolve() for r in group.get("runs", [])):
            return {**group, "baseline": result.get("baseline")}
    return None


def row_in_comparison_beside(run: RunDir) -> dict | None:
    """The run's group in a comparison.json beside it (what scripts/sweep.py writes), if any."""
    for path in comparisons_beside(run):
        try:
            row = comparison_row(read_json(path, "comparison"), run)
        except UserError:  # a damaged comparison beside the run: the card goes without its row
            continue
        if row is not None:
            return row
    return None


def export_checkpoint(
    ckpt: Path,
    folder: Path,
    repo_id: str,
    *,
    layout: Layout = Layout.REMOTE_CODE,
    run: RunDir | None = None,
    summary: dict | None = None,
    comparison: dict | None = None,
    experiment: dict | None = None,
    evaluations: Evaluations | None = None,
) -> list[str]:
    """Write ``ckpt`` into ``folder`` as a Hub repo's files; returns their names. ``comparison``: the run's
    group in a comparison; ``experiment``: its row in a sweep published whole (``gpt.publish.release``);
    ``evaluations``: its results, read once by the caller (``gpt.run.directory.Evaluations``)."""
    cfg = checkpoint_config(ckpt)
    tokenizer = checkpoint_tokenizer(ckpt)
    if tokenizer in OFFLINE and tokenizer != "gpt2":  # the export ships GPT-2's tokenizer files
        raise UserError(
            f"{ckpt}: trained on {quoted(tokenizer)} tokens, and a published model carries GPT-2's tokenizer; "
            "publish models trained on GPT-2 tokens (prepare_data --tokenizer gpt2)"
        )
    weights = export_weights(cfg, read_weights(ckpt), layout)
    folder.mkdir(parents=True, exist_ok=True)
    with replacing(folder / MODEL_FILE) as tmp:
        save_file(weights, str(tmp), metadata={"format": "pt"})
    write_json(folder / "config.json", hub_config(cfg, layout))
    files = [MODEL_FILE, "config.json", *write_tokenizer(folder, cfg.model.context_length)]
    if layout is Layout.REMOTE_CODE:
        files += write_code(folder)
    n_params = sum(v.numel() for v in weights.values())  # as published: a tied head once, no padding
    run = run or RunDir.of_checkpoint(ckpt)
    facts = card_facts(ckpt, cfg, repo_id, n_params, run, summary, comparison, layout, experiment, evaluations)
    if facts.loss_png:
        copy_atomically(run.loss_chart, folder / run.loss_chart.name)
        files.append(run.loss_chart.name)
    write_atomically(folder / "README.md", card_text(cfg, facts))
    return [*files, "README.md"]
