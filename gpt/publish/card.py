"""The model card (the Hub repo's README.md) of a published checkpoint.

Hub metadata first (license, library, pipeline tag, tags with the norm type, the data set,
and a ``model-index`` entry whose metric is the held-out test loss ``evaluate.py``
measured), then what a reader wants to know: the model, the data, the schedule, the
hardware and speed, the losses with how and on what they were measured, a line for each other
evaluation task the checkpoint has a result of (its registry entry's ``card``), the run's row of
its comparison when it has one, the loss curve, and how to use it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import yaml

from gpt.config import Config
from gpt.config.architecture import phrases, words
from gpt.evaluation.tasks import TASKS
from gpt.publish.layouts import Layout
from gpt.run.distributed import PEAK_MEMORY, peak_memory_of

LICENSE = "mit"


@dataclass
class CardFacts:
    """What the card says beyond the config; every field may be missing (None)."""

    repo_id: str  # where the card will live, user/name
    n_params: int  # parameters, vocabulary padding left out
    step: int | None = None  # the checkpoint's optimizer step
    best: bool = False  # a best-<step> folder: the weights of the run's best validation, not its last step
    tokens: int | None = None  # training tokens by then
    val_loss: float | None = None  # validation loss at that step
    summary: dict | None = None  # the run's summary.json (None while it trains)
    evaluation: dict | None = None  # the checkpoint's eval-test-fp32.json (None: not evaluated)
    comparison: dict | None = None  # the run's group in a comparison.json, with the baseline's name
    data_source: str | None = None  # the token set's source (meta.json), e.g. HuggingFaceFW/fineweb
    layout: Layout = Layout.REMOTE_CODE  # NATIVE_GPT2: the stock GPT2LMHeadModel layout, no remote code
    loss_png: bool = False  # the run's loss chart is uploaded beside the card, as loss.png
    tasks: dict = field(default_factory=dict)  # task name -> its fp32 result, for each task with a card line
    experiment: dict | None = None  # published with its sweep (gpt.publish.release): its row and the dataset


def metadata(cfg: Config, f: CardFacts) -> dict:
    """The card's YAML front matter."""
    m = cfg.model
    meta = {
        "license": LICENSE,
        "library_name": "transformers",
        "pipeline_tag": "text-generation",
        "tags": ["gpt2", "causal-lm", "normalization", m.norm_type.replace("_", "-"), "gpt-norm-harness"],
    }
    dataset = f.data_source or cfg.data.hub_repo
    if dataset and "/" in dataset:
        meta["datasets"] = [dataset]
    e = f.evaluation
    if e is not None:
        meta["model-index"] = [
            {
                "name": f.repo_id.split("/")[-1],
                "results": [
                    {
                        "task": {"type": "text-generation", "name": "Causal language modeling"},
                        "dataset": {
                            "name": dataset or e.get("data_dir", "held-out tokens"),
                            "type": dataset if dataset and "/" in dataset else "custom",
                            "split": e["split"],
                        },
                        "metrics": [
                            {
                                "type": "loss",
                                "value": round(e["loss"], 6),
                                "name": f"held-out test loss (nats/token, {e['targets_scored']:,} tokens scored)",
                            }
                        ],
                    }
                ],
            }
        ]
    return meta


def _fmt(x, spec: str, missing: str = "n/a") -> str:
    return missing if x is None or (isinstance(x, float) and math.isnan(x)) else format(x, spec)


def _diff(x) -> str:
    """A loss difference: 4 decimals, or 3 significant digits where 4 decimals would show only zeros."""
    return _fmt(x, "+.2e" if isinstance(x, float) and 0 < abs(x) < 5e-5 else "+.4f")


def _duration(seconds) -> str:
    if seconds is None:
        return "n/a"
    return f"{seconds / 3600:.2f} h" if seconds >= 3600 else f"{seconds:,.0f} s"


def model_lines(cfg: Config, f: CardFacts) -> list[str]:
    m, t, o = cfg.model, cfg.train, cfg.optim
    s = f.summary or {}
    return [
        "## Model",
        "",
        f"- GPT-2-style decoder, {m.n_layers} layers, d_model {m.d_model}, {m.n_heads} heads, context "
        f"{m.context_length}, vocabulary {m.vocab_size:,} (GPT-2 BPE): {f.n_params:,} parameters "
        f"({'tied' if m.tie_weights else 'untied'} embeddings, Q/K/V bias {'on' if m.qkv_bias else 'off'}).",
        f"- Norm layer: **`{m.norm_type}`** (eps {m.norm_eps:g}); {'; '.join(words(m))}.",
        f"- Training: {_fmt(f.step, ',')} steps of {cfg.tokens_per_step:,} tokens ({_fmt(f.tokens, ',')} tokens), "
        f"AdamW (lr {o.lr:g}, betas {o.beta1:g}/{o.beta2:g}, weight decay {o.weight_decay:g}), "
        f"{o.warmup_frac:.0%} linear warmup then {o.schedule} to {o.min_lr:g}, precision "
        f"{s.get('precision', t.precision)}, seed {t.seed}.",
        f"- Data: {f.data_source or cfg.data.hub_repo or cfg.data.path}.",
        f"- Hardware: {s.get('world_size', '?')} x {s.get('device', '?')}; wall time "
        f"{_duration(s.get('wall_seconds'))}; "
        f"{_fmt(s.get('tokens_per_s'), ',.0f')} tokens/s (steady state){_memory(s)}.",
        "",
    ]


def _memory(summary: dict) -> str:
    """The run's peak memory, saying what was measured (an allocator's peak and a resident set differ)."""
    memory = peak_memory_of(summary)
    return f"; peak memory {memory[1] / 2**30:.2f} GiB, {PEAK_MEMORY[memory[0]][1]}" if memory else ""


def loss_lines(f: CardFacts) -> list[str]:
    lines = ["## Losses", "", f"- Validation loss at this checkpoint: {_fmt(f.val_loss, '.4f')}."]
    e = f.evaluation
    if e is None:
        lines.append("- Held-out test loss: not evaluated yet (`python evaluate.py RUN` writes it).")
    else:
        lines.append(
            f"- **Held-out test loss: {e['loss']:.4f}** nats/token (perplexity {math.exp(e['loss']):.2f}): "
            f"the mean cross-entropy of the {e['targets_scored']:,} tokens scored (each predicted from those "
            f"before it) in tokens [{e['range'][0]:,}, {e['range'][1]:,}) of the `{e['split']}` split of "
            f"{e.get('data_dir', 'the token set')} ({e.get('tokenizer', 'gpt2')} tokenizer), in {e['precision']}, "
            "by `evaluate.py`; none of these tokens was trained or validated on."
        )
    lines += [TASKS[name].card(result) for name, result in f.tasks.items() if name in TASKS]  # HellaSwag, ...
    if f.experiment is not None:
        lines += experiment_lines(f.experiment)
    c = f.comparison
    if c is not None:
        v = c.get("vs_baseline") or {}
        lines += [
            "",
            f"Its row of the comparison (test loss over {c['n_evaluated']} seed(s)):",
            "",
            f"| group | seeds | test loss mean | sd | vs {c['baseline']} (95% CI) |",
            "|---|---|---|---|---|",
            f"| {c['group']} | {c['n_evaluated']} | {_fmt(c['test_loss_mean'], '.4f')} | "
            f"{_fmt(c['test_loss_std'], '.4f')} | "
            + (f"{_diff(v.get('diff'))} [{_diff(v.get('low'))}, {_diff(v.get('high'))}] |" if v else "baseline |"),
        ]
    if f.loss_png:
        lines += ["", "![training and validation loss](loss.png)"]
    return lines + [""]


def experiment_lines(x: dict) -> list[str]:
    """The run's own row of its published sweep, and where the comparison is (its group means change as
    seeds are added; this row does not)."""
    return [
        "",
        f"Part of a sweep published whole: the comparison of every run, with the group means, their "
        f"intervals, their designs and plans, and every run's data, is the dataset "
        f"[{x['dataset']}](https://huggingface.co/datasets/{x['dataset']}). This run's row:",
        "",
        "| run | norm type | seed | status | test loss |",
        "|---|---|---|---|---|",
        f"| {x['run']} | {x['group']} | {x['seed']} | {x['status']} | {_fmt(x.get('test_loss'), '.6f')} |",
    ]


def status_lines(f: CardFacts) -> list[str]:
    """A run that did not complete says so first: its weights are a record, not a result."""
    s = f.summary or {}
    status = s.get("status")
    if status in (None, "completed"):
        return []
    where = f" at step {s['diverged_at_step']:,}" if s.get("diverged_at_step") is not None else ""
    reason = f" ({s['stop_reason']})" if s.get("stop_reason") else ""
    return [
        f"> **This run {status}{where}{reason}.** Its {'best-validation' if f.best else 'last'} checkpoint (step "
        f"{_fmt(f.step, ',')}) is published for the record; it is not a trained model, and no comparison's "
        "statistics use it.",
        "",
    ]


def usage_lines(f: CardFacts) -> list[str]:
    native = f.layout is Layout.NATIVE_GPT2
    remote = "" if native else ", trust_remote_code=True"
    how = (
        "the stock `GPT2LMHeadModel` layout (zero Q/K/V bias where the model has none); no remote code"
        if native
        else "the harness's own model code shipped in this repo (`modeling_gpt_norm.py` wraps `gpt.py`)"
    )
    return [
        "## Usage",
        "",
        f"Loads with {how}.",
        "",
        "```python",
        "from transformers import AutoModelForCausalLM, AutoTokenizer",
        f'model = AutoModelForCausalLM.from_pretrained("{f.repo_id}"{remote})',
        f'tokenizer = AutoTokenizer.from_pretrained("{f.repo_id}"{remote})',
        'ids = tokenizer("The meaning of life is", return_tensors="pt").input_ids',
        "print(tokenizer.decode(model.generate(ids, max_new_tokens=40, do_sample=True, top_k=50)[0]))",
        "# a batch of prompts: left-padded, with a key-value cache, as with any causal LM",
        'batch = tokenizer(["The king", "Good morrow, my lord"], padding=True, return_tensors="pt")',
        "print(tokenizer.batch_decode(model.generate(**batch, max_new_tokens=20, do_sample=False)))",
        "```",
        "",
        "Or with the harness: `python scripts/generate.py " + f.repo_id + ' --prompt "..."`.',
        "",
    ]


def _variant(cfg: Config) -> str:
    """The model's options that are not GPT-2's own (pre-norm, a final norm, no QK-norm, ...), in short words."""
    return "".join(f", {w}" for w in phrases(cfg.model))


def card_text(cfg: Config, f: CardFacts) -> str:
    """The whole README.md."""
    head = "---\n" + yaml.safe_dump(metadata(cfg, f), sort_keys=False) + "---\n"
    title = [
        f"# {f.repo_id.split('/')[-1]}",
        "",
        f"A GPT-2-style model trained with gpt-norm-harness to compare "
        f"normalisation layers; this one uses `{cfg.model.norm_type}`{_variant(cfg)}.",
        "",
        *status_lines(f),
    ]
    return head + "\n".join(title + model_lines(cfg, f) + loss_lines(f) + usage_lines(f))
