"""The comparison as Markdown: what every run shares, the table, the noise, what was left out.

Reads only the result ``gpt.analysis.table.summarise`` builds (the same data as
``comparison.json``), so the report and the JSON never disagree.
"""

from __future__ import annotations

import math

from gpt.analysis import stats


def markdown(result: dict) -> str:
    lines = [f"# Comparison (baseline: {result['baseline']})", ""]
    if result.get("baseline_rule"):
        lines += [f"Baseline: {result['baseline_rule']}.", ""]
    if result["test_range"]:
        t = result["test_range"]
        lines += [
            f"Test loss: mean cross-entropy of the {_fmt(t.get('targets_scored'), ',')} tokens scored (each "
            f"predicted from those before it) in {t['split']} tokens [{t['offset']:,}, "
            f"{t['offset'] + t['n_tokens']:,}) of {t['data_dir']} ({t['tokenizer']}), {t['precision']}.",
            "",
        ]
    lines += shared_lines(result)
    lines += _main_table(result["groups"])
    lines += [
        "",
        "Intervals: t distribution; 'paired' pairs runs by seed (same initial weights outside the norm), "
        "'welch' is unpaired. n/a: fewer than two seeds. Statistics use completed, evaluated runs only. "
        "skipped steps: updates dropped for a non-finite gradient (fp16 overflow, divergence); a run with "
        "any trained on fewer updates than the rest.",
    ]
    lines += _noise_table(result)
    lines += _task_lines(result)
    lines += _sources_lines(result["groups"])
    left_out = [(g["group"], x) for g in result["groups"] for x in g["left_out"]]
    if left_out:
        lines += ["", "Left out of the statistics:"]
        lines += [f"- {group}, seed {x['seed']} ({x['path']}): {x['reason']}" for group, x in left_out]
    missing = [p for g in result["groups"] for p in g["missing_evaluation"]]
    if missing:
        lines += ["", "Not evaluated (run `python evaluate.py` on them): " + ", ".join(missing)]
    return "\n".join(lines) + "\n"


def _fmt(x, spec=".4f"):
    return "n/a" if x is None or (isinstance(x, float) and math.isnan(x)) else format(x, spec)


def _loss(x, sign: str = "") -> str:
    """A loss difference: 6 decimals, or 3 significant digits when that would show only zeros."""
    small = isinstance(x, float) and x != 0 and abs(x) < 5e-7
    return _fmt(x, f"{sign}.2e" if small else f"{sign}.6f")


def _on_off(value) -> str:
    return {True: "on", False: "off"}.get(value, str(value))


def _identity(shared: dict, split: str) -> str | None:
    """A split's identity in a few characters: its sha256 (or sampled sha256) and token count."""
    digest = shared.get(f"data.{split}.sha256")
    kind = "sha256"
    if not digest:
        digest, kind = shared.get(f"data.{split}.sampled_sha256"), "sampled sha256"
    if not digest:
        return None
    return f"{split} {kind} {digest[:12]} ({shared.get(f'data.{split}.tokens', 0):,} tokens)"


def shared_lines(result: dict) -> list[str]:
    """The section that says what every run has in common, and what is allowed to differ."""
    s = result.get("shared") or {}
    lines = ["## What every run shares", ""]
    if "total_steps" in s and "train.global_batch_size" in s and "model.context_length" in s:
        per_step = s["train.global_batch_size"] * s["model.context_length"]
        lines.append(
            f"- length: {s['total_steps']:,} steps x {per_step:,} tokens = {s['total_steps'] * per_step:,} tokens"
        )
    if "train.precision" in s:
        lines.append(
            f"- precision as used: {s['train.precision']}; compile {_on_off(s.get('train.compile'))}; "
            f"TF32 {_on_off(s.get('train.tf32'))}"
        )
    if "hardware.device" in s:
        lines.append(
            f"- hardware: {s.get('hardware.world_size', '?')} x {s.get('hardware.name', '?')} "
            f"({s['hardware.device']}), micro-batch {s.get('train.micro_batch_size', '?')}, gradient "
            f"accumulation {s.get('train.grad_accum', '?')}; torch {s.get('software.torch', '?')}"
            + (f", CUDA {s['software.cuda']}" if s.get("software.cuda") else "")
        )
    if "code.source" in s:
        commit = s.get("code.commit")
        where = (
            f"commit {commit[:10]}{' with uncommitted changes' if s.get('code.dirty') else ''}"
            if commit
            else "not a git checkout"
        )
        lines.append(
            f"- code: gpt-norm-harness {s.get('code.version') or '?'}, {where}; source sha256 {s['code.source'][:12]}"
        )
    data = [x for x in (_identity(s, "train"), _identity(s, "val")) if x]
    if data or "evaluation.test" in s:
        lines.append(
            f"- data: tokenizer {s.get('data.tokenizer', '?')}; "
            + "; ".join(data + ([f"test {s['evaluation.test']}"] if "evaluation.test" in s else []))
        )
    lines += _decay_lines(result)
    for key, values in (result.get("allowed_to_differ") or {}).items():
        listed = "; ".join(f"{v['value']} ({', '.join(v['runs'])})" for v in values)
        lines.append(f"- **allowed to differ** (--allow-differ): {key}: {listed}")
    if result.get("varied"):
        lines.append(f"- varied (--vary, one group per value): {', '.join(result['varied'])}")
    if result.get("without_fingerprint"):
        lines.append(
            "- no fingerprint (trained before fingerprints were recorded; compared on their configs "
            f"only): {', '.join(result['without_fingerprint'])}"
        )
    return lines + [""]


def _decay_lines(result: dict) -> list[str]:
    s = result.get("shared") or {}
    decay, norms = s.get("optim.weight_decay"), s.get("optim.decay_norms_and_biases")
    if decay is None or norms is None:
        return []
    if not decay or not norms:
        return [f"- weight decay {decay:g} on weight matrices only: no norm parameter is decayed"]
    counts = ", ".join(
        f"{g['group']} {g['decayed_norm_params']:,}" for g in result["groups"] if g["decayed_norm_params"] is not None
    )
    return [
        f"- weight decay {decay:g} on every parameter, **norm parameters included** "
        f"(optim.decay_norms_and_biases: true, the write-up's choice): it pulls norm gains and DyT's alpha toward "
        f"0, unequally across norm types; decayed norm parameters: {counts or 'n/a'}"
    ]


def _main_table(rows: list[dict]) -> list[str]:
    lines = [
        "| group | seeds | test loss mean | std | vs baseline (95% CI) | tokens/s | wall s | skipped steps | status |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for g in rows:
        v = g["vs_baseline"]
        if v is None:
            versus = "baseline"
        elif v["method"] is None:
            versus = "n/a"
        else:
            pairs = f", {v['n']} pair{'s' if v['n'] != 1 else ''}" if v["method"] == "paired" else ""
            versus = f"{_loss(v['diff'], '+')} [{_loss(v['low'], '+')}, {_loss(v['high'], '+')}] {v['method']}{pairs}"
        status = ", ".join(f"{n} {s}" for s, n in g["status"].items())
        if g["diverged_at"]:
            status += f" (diverged at step {', '.join(str(s) for s in g['diverged_at'])})"
        if g["missing_evaluation"]:
            status += f"; {len(g['missing_evaluation'])} not evaluated"
        skipped = g["skipped_steps"]
        skipped = ("**" + ", ".join(f"seed {seed}: {n:,}" for seed, n in skipped.items()) + "**") if skipped else "0"
        lines.append(
            f"| {g['group']} | {len(g['seeds'])} ({', '.join(g['seeds'])}) | "
            f"{_fmt(g['test_loss_mean'], '.6f')} | {_fmt(g['test_loss_std'], '.6f')} | {versus} | "
            f"{_fmt(g['tokens_per_s_mean'], ',.0f')} | {_fmt(g['wall_seconds_mean'], ',.0f')} | {skipped} | "
            f"{status} |"
        )
    return lines


TASK_TITLES = {"hellaswag": "HellaSwag"}
METRIC_NOTE = (
    "acc: the ending with the highest summed log-probability; acc_norm: per character of the ending "
    "(lm-evaluation-harness's); acc_token_mean: the lowest mean per-token loss (llm.c's, build-nanogpt's). "
    "Random guessing: 0.25; OpenAI's GPT-2 124M: 0.2955 acc_token_mean."
)


def _accuracy(m: dict) -> str:
    return f"{_fmt(m['mean'])} [{_fmt(m['ci95'][0])}, {_fmt(m['ci95'][1])}]"


def _versus_items(v: dict) -> str:
    if v["method"] != "paired over items":
        return v["method"]
    text = f"{_fmt(v['diff'], '+.4f')} [{_fmt(v['low'], '+.4f')}, {_fmt(v['high'], '+.4f')}]"
    if v["mcnemar"] is not None:
        c = v["mcnemar"]
        text += f", McNemar p = {c['p']:.3g} ({c['only_this']} vs {c['only_baseline']})"
    return text


def _task_lines(result: dict) -> list[str]:
    """Per task (HellaSwag): each group's accuracies over seeds, and the paired difference over items."""
    lines = []
    for task in sorted({t for g in result["groups"] for t in g.get("tasks", {})}):
        rows = [(g["group"], g["tasks"][task]) for g in result["groups"] if task in g.get("tasks", {})]
        metrics = list(rows[0][1]["metrics"])
        lines += ["", f"## {TASK_TITLES.get(task, task)} ({rows[0][1]['n_items']:,} items)", "", METRIC_NOTE, ""]
        lines += [f"| group | seeds | {' | '.join(metrics)} |", "|---|---|" + "---|" * len(metrics)]
        lines += [
            f"| {name} | {t['n_seeds']} | " + " | ".join(_accuracy(t["metrics"][m]) for m in metrics) + " |"
            for name, t in rows
        ]
        lines += [
            "",
            f"Against {result['baseline']}, paired over items (per item: the fraction of the group's seeds that "
            "answered right minus the baseline's; mean and 95% t interval over items; with one seed each, "
            "McNemar's exact test on the items only one of the two got right):",
            "",
            f"| group | {' | '.join(metrics)} |",
            "|---|" + "---|" * len(metrics),
        ]
        lines += [
            f"| {name} | " + " | ".join(_versus_items(t["vs_baseline"][m]) for m in metrics) + " |"
            for name, t in rows
            if t["vs_baseline"]
        ]
    return lines


def _noise_table(result: dict) -> list[str]:
    margin = result["equivalence_margin"]
    level, power = round(result["level"] * 100), round(result["power"] * 100)
    verdict_head = f"equivalent within +-{margin:g} (TOST p)" if margin is not None else "equivalent"
    lines = [
        "",
        f"## Noise and seeds needed (paired differences vs {result['baseline']})",
        "",
        f"| group | pairs | sd of paired diff | smallest resolvable diff | seeds to resolve observed diff "
        f"| {verdict_head} |",
        "|---|---|---|---|---|---|",
    ]
    for g in result["groups"]:
        v = g["vs_baseline"]
        if v is None:
            continue
        pairs = str(v["n"]) if v["method"] == "paired" else f"0 ({v['method'] or 'no runs'})"
        if v["unpaired"]:
            pairs += f"; unpaired seeds: {', '.join(v['unpaired'])}"
        lines.append(
            f"| {g['group']} | {pairs} | {_loss(v['sd'])} | {_loss(v['resolvable_diff'])} | "
            f"{_seeds_needed_text(v)} | {_equivalence_text(v, margin)} |"
        )
    lines += [
        "",
        "- pairs: seeds that both this group and the baseline completed and evaluated; "
        "each gives one difference d = loss - baseline loss.",
        "- sd of paired diff: the sample standard deviation of those differences (the seed-to-seed noise "
        "that pairing leaves).",
        f"- smallest resolvable diff: the true mean difference that these pairs find with {power}% power in a "
        f"two-sided paired t test at {level}% confidence, the sd taken as the truth.",
        f"- seeds to resolve observed diff: the fewest pairs with which that test finds the observed mean "
        f"difference with {power}% power.",
        "- Both are exact: the power of the paired t test comes from the noncentral t distribution "
        "(scipy.stats.nct), not the central-t shortcut, which overstates it at a few seeds.",
        "- equivalent within +-margin (--equivalence-margin): two one-sided t tests at 5% each, i.e. the "
        "90% interval lies inside +-margin; 'not shown' means a difference of the margin is not ruled out.",
    ]
    return lines


def _seeds_needed_text(v: dict) -> str:
    if v["method"] != "paired" or v["n"] < 2:
        return "n/a (needs 2 pairs)"
    if not v["diff"]:
        return "n/a (no difference)"
    return str(v["seeds_needed"]) if v["seeds_needed"] is not None else f"> {stats.MAX_SEEDS:,}"


def _equivalence_text(v: dict, margin: float | None) -> str:
    if margin is None:
        return "give --equivalence-margin"
    eq = v["equivalence"]
    if eq is None or eq["equivalent"] is None:
        return "n/a (needs 2 pairs)"
    return f"{'yes' if eq['equivalent'] else 'not shown'} (p = {eq['p']:.3g})"


SOURCES = (
    ("init", "initial weights (model.init_seed)"),
    ("data", "data order (train.seed)"),
    ("residual", "what remains (their interaction)"),
)


def _sources_lines(rows: list[dict]) -> list[str]:
    """Where seed-to-seed noise comes from, for each group whose seeds are crossed."""
    crossed = [(g["group"], g["noise_sources"]) for g in rows if g["noise_sources"]]
    if not crossed:
        return []
    lines = ["", "## Where the noise comes from (crossed initialisation x data-order seeds)"]
    for group, n in crossed:
        design = f"{len(n['init_seeds'])} initialisation seeds x {len(n['data_seeds'])} data-order seeds"
        if n["missing"]:
            lines += [
                "",
                f"{group}: {design}, incomplete: no evaluated run for init/data {', '.join(n['missing'])}; "
                "complete the grid (the sweep's --init-seeds / --data-seeds) to split the variance.",
            ]
            continue
        level = round(n["level"] * 100)
        lines += [
            "",
            f"{group}: {design}, test loss mean {n['mean']:.6f}, total variance {n['total_variance']:.3g}.",
            "",
            f"| source | sd | variance | {level}% interval (variance) | share |",
            "|---|---|---|---|---|",
        ]
        for key, name in SOURCES:
            c = n["components"][key]
            negative = " (estimate < 0, shown as 0)" if c["estimate"] < 0 else ""
            lines.append(
                f"| {name} | {c['sd']:.3g} | {c['variance']:.3g}{negative} | [{c['low']:.3g}, "
                f"{c['high']:.3g}] | {_fmt(c['share'] * 100, '.0f')}% |"
            )
    lines += [
        "",
        "- Two-way random-effects ANOVA without replication (one run per seed pair): variance from the "
        "initial weights, from the data order, and the rest; method-of-moments estimates, intervals exact "
        "(chi-square) for the rest and Graybill-Wang modified large-sample for the two others; a few seeds "
        "give wide intervals.",
    ]
    return lines
