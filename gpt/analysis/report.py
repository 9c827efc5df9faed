"""The comparison as Markdown: what every run shares, the table, the noise, what was left out.

Reads only the result ``gpt.analysis.summary.summarise`` builds (the same data as
``comparison.json``), so the report and the JSON never disagree; each task's heading and note
come from its registry entry (``gpt.evaluation.tasks``).
"""

from __future__ import annotations

import math
from pathlib import Path

from gpt.analysis import stats
from gpt.analysis.selection import (
    LEVEL_EACH,
    SINGLE_STAGE_COVERED,
    SINGLE_STAGE_MISSED,
    direction,
    edge_line,
)
from gpt.analysis.speedup import lines as speedup_lines
from gpt.evaluation.tasks import TASKS
from gpt.run.directory import STATS_FILE

MARKDOWN_ESCAPES = str.maketrans({"&": "&amp;", "<": "&lt;", ">": "&gt;", "|": "\\|", "\n": "\\n", "\r": "\\r"})


def escaped(value):
    """``value`` (a result, as JSON holds it) with every string safe in a Markdown table cell: no raw HTML, no
    ``|`` that splits a cell, no line break that ends a row (shown as \\n). Group names and config values are a
    user's text."""
    if isinstance(value, str):
        return value.translate(MARKDOWN_ESCAPES)
    if isinstance(value, dict):
        return {escaped(k) if isinstance(k, str) else k: escaped(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [escaped(v) for v in value]
    return value


def markdown(result: dict) -> str:
    result = escaped(result)  # everything below formats the result's text into Markdown as it stands
    lines = [f"# Comparison (baseline: {result['baseline']})", ""]
    if result.get("baseline_rule"):
        lines += [f"Baseline: {result['baseline_rule']}.", ""]
    if result.get("selection"):
        lines += [
            f"Each norm type at its learning rate chosen on validation loss, never on test loss (section "
            f"'{SELECTION_HEADING}'); every test loss below is at the chosen rate. The rates were chosen on these "
            "same runs, so the intervals below are not 95% intervals: they are optimistic, by the bounds in that "
            "section (sweep.py --confirm-seeds trains the chosen rates on fresh seeds and compares those).",
            "",
        ]
    lines += confirmation_lines(result.get("confirmation"))
    if result["test_range"]:
        t = result["test_range"]
        lines += [
            f"Test loss: mean cross-entropy of the {_fmt(t.get('targets_scored'), ',')} tokens scored (each "
            f"predicted from those before it) in {t['split']} tokens [{t['offset']:,}, "
            f"{t['offset'] + t['n_tokens']:,}) of {t['data_dir']} ({t['tokenizer']}), {t['precision']}. "
            + _per_byte_text(t),
            "",
        ]
    if result.get("source"):
        lines += [
            f"Results from the table {result['source']} (`compare.py --results`): its numbers only; nothing is "
            "known here of how the runs were trained or evaluated, so nothing of that is checked.",
            "",
        ]
    else:
        lines += shared_lines(result)
    lines += _main_table(result["groups"], optimistic_by_group(result.get("selection")), result["baseline"])
    lines += selection_lines(result.get("selection"))
    lines += _inside_lines(result.get("inside"))
    for f in result.get("failed") or []:
        lines += ["", f"**Failed, no result:** {f['run']}: {f['error']}"]
    lines += [
        "",
        "Intervals: 95%, t distribution, by the design of the seeds (next section); 'paired' pairs runs by seed "
        "(same initial weights outside the norm, same data order), 'crossed' analyses a grid of init x data "
        "seeds, 'welch' is unpaired. n/a: fewer than two seeds. Statistics use completed, evaluated runs only. "
        "skipped steps: updates dropped for a non-finite gradient (fp16 overflow, divergence); a run with "
        "any trained on fewer updates than the rest.",
    ]
    lines += _versus_table(result)
    lines += crossed_lines(result.get("crossed"))
    lines += speedup_lines(result.get("effective_speedup"))
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


SELECTION_HEADING = "Learning rate chosen on validation"


def selection_lines(selection: dict | None) -> list[str]:
    """Every rate's validation loss by norm type with the choice marked, how it was chosen, and what the
    intervals at the chosen rate do not account for (``gpt.analysis.selection``); nothing without a selection."""
    if not selection:
        return []
    key, steps = selection["key"], selection["val_steps"]
    at = f"step {steps[0]:,}" if len(steps) == 1 else f"steps {', '.join(f'{s:,}' for s in steps)}" if steps else "-"
    lines = [
        "",
        f"## {SELECTION_HEADING}",
        "",
        f"Per norm type, the {key} with the lowest mean over seeds of {selection['measure']}; here at {at}. "
        "The selection was on validation, never on test: no test loss chose anything. A rate where a run "
        "diverged, did not finish or is missing could not be chosen. lr_sensitivity.png draws this table.",
        "",
        f"| norm type | {key} | seeds | validation loss mean | sd | min over seeds | max over seeds | choice |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for family in selection["families"]:
        for i, rate in enumerate(family["rates"]):
            choice = "**chosen**" if rate["chosen"] else ("" if rate["eligible"] else f"not eligible: {rate['reason']}")
            lines.append(
                f"| {family['family'] if i == 0 else ''} | {rate['value']:g} | {rate['n']} of {len(rate['runs'])} | "
                f"{_fmt(rate['val_loss_mean'], '.6f')} | {_fmt(rate['val_loss_sd'], '.6f')} | "
                f"{_fmt(rate['val_loss_min'], '.6f')} | {_fmt(rate['val_loss_max'], '.6f')} | {choice} |"
            )
    lines += [""] + [
        f"- {f['family']}: no rate chosen (none had a completed run with a validation loss at every seed), so it "
        "is not in the test-loss table."
        for f in selection["families"]
        if f["chosen"] is None
    ]
    lines += [f"- {line}" for line in filter(None, (edge_line(f, key) for f in selection["families"]))]
    o = selection.get("optimism") or {"families": {}, "rho": math.nan}
    bounds = [(label, b) for label, b in o["families"].items() if b is not None]
    level = 100 * (1 - 2 * (1 - o.get("level_each", LEVEL_EACH)))
    return lines + [
        "- The test losses, intervals and p-values at the chosen rates do not account for the selection: they "
        "treat each rate as fixed before the runs. The rate was chosen on the same runs whose test losses are "
        "reported; the test tokens chose nothing, but a run's validation and test losses are nearly the same draw "
        f"(correlation {_fmt(o['rho'], '.3f')} here, lower limit {_fmt(o.get('rho_low'), '.3f')}, from the runs "
        "once each rate's and each seed's effect are taken out), so a rate that won because its seeds happened "
        "to train well carries that luck into its test loss. Each chosen rate's test loss reads low by about "
        "rho x sd / sqrt(n) x E[how far the winner's mean lands below its own] (sd: the run noise once each "
        "seed's shared effect is taken out, n: seeds; the expectation over the rates' curve, its means shrunk "
        f"by the share of their spread the noise explains), and by at most the {level:g}% upper limit (the "
        "correlation taken as 1, sd and the curve's gaps at their limits). The difference between two norm types "
        "is biased towards the one whose test loss reads lower; which one is said only where one's lower limit "
        "exceeds the other's upper. More seeds shrink the bias only as they shrink the standard error, so the "
        "interval's coverage stays below 95%. Simulated (tests/analysis/test_selection_coverage.py), the interval "
        f"covered the true difference {'-'.join(map(str, SINGLE_STAGE_COVERED))}% of the time and missed on the "
        f"favoured side {'-'.join(map(str, SINGLE_STAGE_MISSED))}% (nominal 2.5%).",
        *(
            f"  - {label}: about {_fmt(b['bound'], '.4f')}, at most {_fmt(b['upper'], '.4f')}, at least "
            f"{_fmt(b['lower'], '.4f')} ({b['k']} rates, sd {_fmt(b['sd'], '.4f')} on {b['df']} df, n={b['n']})"
            for label, b in bounds
        ),
        "- For 95% intervals, choose on some seeds and report on others: sweep.py --lrs ... --seeds S... "
        "--confirm-seeds C... trains each chosen rate again on the fresh seeds C and compares only those.",
    ]


def optimistic_by_group(selection: dict | None) -> dict[str, dict]:
    """The optimism bound of each chosen rate's group (``gpt.analysis.selection.optimism``); {} without a selection
    made on the compared runs."""
    if not selection or not selection.get("optimism"):
        return {}
    return {b["group"]: b for b in selection["optimism"]["families"].values() if b is not None}


CONFIRMATION_HEADING = "Learning rates chosen on other seeds"


def confirmation_lines(confirmation: dict | None) -> list[str]:
    """Where a two-stage sweep's rates came from: each norm type's chosen rate, the seeds it was chosen on and the
    fresh seeds compared here; nothing for a comparison that is not a confirmation."""
    if not confirmation:
        return []
    lines = [
        f"## {CONFIRMATION_HEADING}",
        "",
        f"Each norm type at the {confirmation['key']} chosen on validation loss of the selection seeds "
        f"{', '.join(map(str, confirmation['selection_seeds']))} (comparison in {confirmation['selection']}); the "
        f"runs compared here are fresh seeds {', '.join(map(str, confirmation['confirm_seeds']))} trained at those "
        "rates alone, so the choice's luck is not in them: the intervals below are 95% intervals of the difference "
        "at the chosen rates.",
        "",
        f"| norm type | {confirmation['key']} chosen | of the grid |",
        "|---|---|---|",
    ]
    for family in confirmation["families"]:
        grid = ", ".join(f"{v:g}" for v in family["grid"])
        lines.append(f"| {family['family']} | {_fmt(family['chosen_value'], 'g')} | {grid} |")
    flagged = [line for line in (edge_line(f, confirmation["key"]) for f in confirmation["families"]) if line]
    unchosen = [f["family"] for f in confirmation["families"] if f["chosen_value"] is None]
    lines += [""] + [f"- {line}" for line in flagged]
    lines += [f"- {name}: no rate chosen (no rate had every seed finish), so not confirmed" for name in unchosen]
    return [*lines, ""]


def _inside_lines(inside: dict | None) -> list[str]:
    """Where the sheet of what each norm does inside the model is, and which runs it lacks (they logged no
    stats); nothing when no run logged them."""
    if not inside or not inside["with_stats"]:
        return []
    missing = inside["without_stats"]
    without = f"without {STATS_FILE}: {', '.join(missing)}" if missing else "every run has them"
    return ["", f"Inside the model: {Path(inside['plot']).name} ({len(inside['with_stats'])} runs); {without}"]


def _interval(v: dict, fmt) -> str:
    """A difference as the tables show it: ``+d [low, high] method, size``, or why there is no interval."""
    if v["method"] is None:
        return "n/a"
    if v["method"] == "crossed":
        size = f" {len(v['init_seeds'])}x{len(v['data_seeds'])}"
    elif v["method"] == "paired":
        size = f", {v['n']} pair{'s' if v['n'] != 1 else ''}"
    else:
        size = ""
    if v.get("no_spread"):
        return f"{fmt(v['diff'], '+')}, no spread ({v['n']} equal differences) {v['method']}{size}"
    if v.get("design") == stats.INCOMPLETE:
        missing = ", ".join(f"{i}/{j}" for i, j in v["missing"])
        return f"n/a: incomplete grid, missing init/data {missing}"
    return f"{fmt(v['diff'], '+')} [{fmt(v['low'], '+')}, {fmt(v['high'], '+')}] {v['method']}{size}"


def crossed_lines(section: dict | None) -> list[str]:
    """A crossed comparison (``gpt.analysis.interaction``): each norm type's effect within every level, its
    interaction with each level beside the reference one, Holm over each family, and a verdict per interaction."""
    if not section:
        return []
    by, base, levels = " x ".join(section["by"]), section["baseline"], section["levels"]
    lines = ["", f"## Does the effect depend on {by}?", "",
             f"Each norm type minus {base} at the same level ({', '.join(levels)}; the reference: {levels[0]}), "
             "paired on the seeds they share, Holm p over the norm types of a level. The interaction is the effect "
             f"at a level minus the effect at {levels[0]}: paired on the seeds the levels share (a crossed sweep's), "
             "else Welch; Holm p over every interaction; resolvable: the smallest interaction these seeds detect "
             "with 80% power.", "",
             "| norm type | " + " | ".join(f"effect at {lv} | Holm p" for lv in levels) + " |",
             "|---|" + "---|---|" * len(levels)]  # fmt: skip
    for row in section["rows"]:
        cells = [f"{_interval(e, _loss)} | {_p(e.get('holm_p'))}" for e in row["effects"]]
        lines.append(f"| {row['norm']} | " + " | ".join(cells) + " |")
    lines += ["", "| norm type | level | interaction (effect minus at the reference) | p | Holm p | resolvable |",
              "|---|---|---|---|---|---|"]  # fmt: skip
    for row in section["rows"]:
        for i in row["interactions"]:
            lines.append(f"| {row['norm']} | {i['level']} vs {i['reference']} | {_interval(i, _loss)} | "
                         f"{_p(i['p'])} | {_p(i['holm_p'])} | {_loss(i['resolvable'])} |")  # fmt: skip
    lines += ["", *(f"- {i['verdict']}" for row in section["rows"] for i in row["interactions"])]
    return lines


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
        lines.append(
            f"- code: gpt-norm-harness {s.get('code.version') or '?'}, {_commits(s)}; source sha256 "
            f"{s['code.source'][:12]}"
        )
    evaluation = _evaluation_line(s)
    if evaluation:
        lines.append(evaluation)
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


def _commits(s: dict) -> str:
    """The commit(s) the runs were trained from, and which had uncommitted changes."""
    if s.get("code.commits"):
        where = "; ".join(f"{c[:10]} ({', '.join(runs)})" for c, runs in s["code.commits"].items())
        text = f"commits {where} (the same source)"
    elif s.get("code.commit"):
        text = f"commit {s['code.commit'][:10]}"
    else:
        text = "not a git checkout"
    if s.get("code.dirty"):
        text += " with uncommitted changes"
    elif s.get("code.dirty_runs"):
        text += f"; uncommitted changes in {', '.join(s['code.dirty_runs'])}"
    return text


def _evaluation_line(s: dict) -> str | None:
    """How every test loss was computed, where the evaluations agree (they must, or compare refuses them)."""
    if "evaluation.precision" not in s:
        return None
    parts = [s["evaluation.precision"]]
    if "evaluation.tf32" in s:
        parts.append("fp32 matmuls in TF32" if s["evaluation.tf32"] else "fp32 matmuls in IEEE fp32 (no TF32)")
    if "evaluation.batch_size" in s:
        parts.append(f"batch {s['evaluation.batch_size']}")
    if "evaluation.hardware.device" in s:
        parts.append(f"{s['evaluation.hardware.device']} ({s.get('evaluation.hardware.name', '?')})")
    if "evaluation.software.torch" in s:
        cuda = s.get("evaluation.software.cuda")
        parts.append(f"torch {s['evaluation.software.torch']}" + (f", CUDA {cuda}" if cuda else ""))
    if "evaluation.code.source" in s:
        parts.append(f"code source sha256 {s['evaluation.code.source'][:12]}")
    return "- test loss evaluated by one evaluator: " + "; ".join(parts)


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


def _optimism_text(group: str, ours: dict, baseline: str, theirs: dict) -> str:
    """How a difference at rates chosen on its own runs is biased: each side's optimism, the range of the bias,
    and towards which norm type where the bounds say it (``gpt.analysis.selection.direction``)."""
    towards = direction(group, ours, baseline, theirs)
    said = (
        f"favours {towards}" if towards else "direction unclear: neither side's lower limit exceeds the other's upper"
    )
    return (
        f"(optimistic, {said}: {group} reads low by about {_fmt(ours['bound'], '.4f')} (at most "
        f"{_fmt(ours['upper'], '.4f')}), {baseline} by about {_fmt(theirs['bound'], '.4f')} (at most "
        f"{_fmt(theirs['upper'], '.4f')}); the difference's bias lies in [{_fmt(-ours['upper'], '+.4f')}, "
        f"{_fmt(theirs['upper'], '+.4f')}])"
    )


def _per_byte_text(t: dict) -> str:
    """How the nats per token read as bits per byte of the scored text (or why they cannot here)."""
    if t.get("bits_per_byte_per_nat") is None:
        return (
            "Bits per byte: not known (the evaluation did not count its text's bytes: evaluated before they were "
            "counted, or a tokenizer not known here; evaluate.py again counts them)."
        )
    return (
        f"Bits per byte = nats per token x {t['bits_per_byte_per_nat']:.6f} ({t['targets_scored']:,} tokens scored "
        f"on {t['bytes_scored']:,} bytes of text, / ln 2): the unit in which models of other tokenizers compare."
    )


def _main_table(rows: list[dict], optimistic: dict[str, dict] | None = None, baseline: str = "") -> list[str]:
    """The test losses and each group's difference to the baseline; ``optimistic``: the optimism bound of each
    group whose rate was chosen on these runs (its interval is then marked, with the direction of the bias)."""
    optimistic = optimistic or {}
    ci = "nominal 95% CI, optimistic: rates chosen on these runs" if optimistic else "95% CI"
    lines = [
        f"| group | seeds | test loss mean | bits/byte | std | vs baseline ({ci}) | tokens/s | wall s | skipped steps "
        "| status |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for g in rows:
        v = g["vs_baseline"]
        versus = "baseline" if v is None else _interval(v, _loss)
        if v is not None and g["group"] in optimistic and baseline in optimistic:
            versus += " " + _optimism_text(g["group"], optimistic[g["group"]], baseline, optimistic[baseline])
        status = ", ".join(f"{n} {s}" for s, n in g["status"].items())
        if g["diverged_at"]:
            status += f" (diverged at step {', '.join(str(s) for s in g['diverged_at'])})"
        if g["missing_evaluation"]:
            status += f"; {len(g['missing_evaluation'])} not evaluated"
        skipped = g["skipped_steps"]
        skipped = ("**" + ", ".join(f"seed {seed}: {n:,}" for seed, n in skipped.items()) + "**") if skipped else "0"
        lines.append(
            f"| {g['group']} | {len(g['seeds'])} ({', '.join(g['seeds'])}) | "
            f"{_fmt(g['test_loss_mean'], '.6f')} | {_fmt(g.get('test_loss_bits_per_byte'), '.4f')} | "
            f"{_fmt(g['test_loss_std'], '.6f')} | {versus} | "
            f"{_fmt(g['tokens_per_s_mean'], ',.0f')} | {_fmt(g['wall_seconds_mean'], ',.0f')} | {skipped} | "
            f"{status} |"
        )
    return lines


def _task_heading(task: str) -> tuple[str, str | None]:
    """A task's title and note, as its registry entry declares them (``gpt.evaluation.tasks``; a task not
    registered, a results table's column, goes by its name)."""
    t = TASKS.get(task)
    if t is None:
        return task, None
    note = t.note or "; ".join(
        f"{m.name}: {m.title} ({'higher' if m.higher_is_better else 'lower'} is better)" for m in t.metrics
    )
    return t.title or t.name, note or None


def _accuracy(m: dict) -> str:
    return f"{_fmt(m['mean'])} [{_fmt(m['ci95'][0])}, {_fmt(m['ci95'][1])}]"


def _metric_versus(v: dict) -> str:
    text = _interval(v, lambda x, sign="": _fmt(x, f"{sign}.4f"))
    return text if math.isnan(v.get("p", math.nan)) else f"{text}, p {_p(v['p'])} (Holm {_p(v.get('p_holm'))})"


def _checkpoint_text(v: dict) -> str:
    if v["method"] != "paired over items":
        return v["method"]
    c = v["mcnemar"]
    return (
        f"{_fmt(v['diff'], '+.4f')} [{_fmt(v['low'], '+.4f')}, {_fmt(v['high'], '+.4f')}], "
        f"McNemar p = {c['p']:.3g} ({c['only_this']} vs {c['only_baseline']})"
    )


def _task_lines(result: dict) -> list[str]:
    """Per task (``gpt.evaluation.tasks``: HellaSwag, ...): each group's metrics over seeds, their differences
    to the baseline over seeds, and,
    where two groups have one run each, what the items say about those two checkpoints."""
    lines = []
    for task in sorted({t for g in result["groups"] for t in g.get("tasks", {})}):
        rows = [(g["group"], g["tasks"][task]) for g in result["groups"] if task in g.get("tasks", {})]
        metrics = list(rows[0][1]["metrics"])
        items = rows[0][1].get("n_items")
        title, note = _task_heading(task)
        lines += ["", f"## {title}" + (f" ({items:,} items)" if items else ""), ""]
        if note:
            lines += [note, ""]
        lines += [f"| group | seeds | {' | '.join(metrics)} |", "|---|---|" + "---|" * len(metrics)]
        lines += [
            f"| {name} | {t['n_seeds']} | " + " | ".join(_accuracy(t["metrics"][m]) for m in metrics) + " |"
            for name, t in rows
        ]
        family = result.get("families", {}).get(task, 0)
        lines += [
            "",
            f"Against {result['baseline']}, over seeds: each run's metric, paired by seed as the test loss is (the "
            "norm types' comparison: a new seed is a new model); 95% interval, p and its Holm adjustment over the "
            f"family of {family} comparisons (every group and metric of this task):",
            "",
            f"| group | {' | '.join(metrics)} |",
            "|---|" + "---|" * len(metrics),
        ]
        lines += [
            f"| {name} | " + " | ".join(_metric_versus(t["vs_baseline"][m]) for m in metrics) + " |"
            for name, t in rows
            if t["vs_baseline"]
        ]
        pairs = [(name, t["two_checkpoints"]) for name, t in rows if t.get("two_checkpoints")]
        if pairs:
            lines += [
                "",
                "Two checkpoints, item by item (a statement about these two trained models, one initialisation and "
                "one data order each, not about their norm types: the items are the only noise it sees): the "
                "difference in accuracy paired over items with its 95% t interval, and McNemar's exact test on the "
                "items exactly one of the two got right.",
                "",
                f"| checkpoint | against | {' | '.join(metrics)} |",
                "|---|---|" + "---|" * len(metrics),
            ]
            lines += [
                f"| {c['this']} | {c['baseline']} | " + " | ".join(_checkpoint_text(c[m]) for m in metrics) + " |"
                for _, c in pairs
            ]
    return lines


def _p(x) -> str:
    return _fmt(x, ".3g")


def _versus_table(result: dict) -> list[str]:
    """Each group against the baseline: the design and what its interval assumes, the p-values (Holm-adjusted
    over the family), TOST, and the prospective plan."""
    rows = [g for g in result["groups"] if g["vs_baseline"] is not None]
    if not rows:
        return []
    margin, detect = result["equivalence_margin"], result.get("detect")
    level, power = round(result["level"] * 100), round(result["power"] * 100)
    bound = round(result.get("plan_confidence", stats.PLAN_CONFIDENCE) * 100)
    family = result.get("families", {}).get("test_loss", 0)
    verdict_head = f"equivalent within +-{margin:g} (TOST p)" if margin is not None else "equivalent"
    detect_head = f"pairs to detect {detect:g}" if detect is not None else "pairs to detect (--detect)"
    lines = [
        "",
        f"## Against {result['baseline']}: designs, tests, planning",
        "",
        f"| group | design | p | Holm p ({family} in the family) | {verdict_head} | sd of one difference "
        f"({bound}% upper bound) | smallest resolvable diff | {detect_head} |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for g in rows:
        v = g["vs_baseline"]
        design = v["design"] or "no runs"
        if v["unpaired"]:
            design += f"; unpaired seeds: {', '.join(v['unpaired'])}"
        plan = v.get("plan") or {}
        lines.append(
            f"| {g['group']} | {design} | {_p(v['p'])} | {_p(v.get('p_holm'))} | {_equivalence_text(v, margin)} | "
            f"{_plan_sd(v, plan)} | {_loss(plan.get('resolvable'))} | {_pairs_text(v, plan, detect)} |"
        )
    designs = sorted({g["vs_baseline"]["design"] for g in rows if g["vs_baseline"]["design"] in stats.ASSUMES})
    lines += ["", "What each design's interval assumes:"]
    lines += [f"- {d}: {stats.ASSUMES[d]}." for d in designs]
    lines += [
        f"- p: of 'no difference', two-sided, on the interval's degrees of freedom. Holm p: Holm's step-down "
        f"adjustment over the family of the {family} comparison(s) with the baseline on test loss; with several "
        f"groups, read these, or some {100 - level}% 'differences' are expected from noise alone.",
        "- equivalent within +-margin (--equivalence-margin): two one-sided t tests at 5% each on the same "
        "estimate and degrees of freedom (the 90% interval inside +-margin); 'not shown' means a difference of "
        "the margin is not ruled out.",
        f"- sd of one difference: the spread of the difference between two runs with the same fresh seeds, at "
        f"its one-sided {bound}% upper confidence bound (chi-square; Graybill-Wang for the crossed model's sum "
        f"of components), so a plan made with it reaches its power with about {bound}% confidence (Browne 1995).",
        f"- smallest resolvable diff: the true difference these seeds detect with {power}% power (exact, "
        f"noncentral t, at {level}% confidence) if the noise is at that upper bound.",
        f"- pairs to detect: the independent seed pairs (each a fresh init and data seed: the fewest runs for a "
        f"mean difference) with which a true difference of the named size (--detect, else the equivalence "
        f"margin) is found with {power}% power, the noise at that upper bound. A total, not how many more; fix "
        "it before training: adding seeds until an interval excludes 0 makes its 5% error larger.",
    ]
    return lines


def _plan_sd(v: dict, plan: dict) -> str:
    if plan.get("no_spread"):
        return "0 (no spread)"
    return _loss(plan.get("sd_upper"))


def _pairs_text(v: dict, plan: dict, detect: float | None) -> str:
    if plan.get("no_spread"):
        return f"n/a: every paired difference is {_loss(v['diff'], '+')}, no noise to plan for"
    if not plan or math.isnan(plan.get("sd_upper", math.nan)):
        return "n/a (needs 2 paired seeds)"
    if detect is None:
        return "give --detect"
    n = plan["pairs_needed"]
    return str(n) if n is not None else f"> {stats.MAX_SEEDS:,}"


def _equivalence_text(v: dict, margin: float | None) -> str:
    if margin is None:
        return "give --equivalence-margin"
    eq = v["equivalence"]
    if eq is None or eq["equivalent"] is None:
        return "n/a: no spread to test" if v.get("no_spread") else "n/a (needs 2 seeds)"
    return f"{'yes' if eq['equivalent'] else 'not shown'} (p = {eq['p']:.3g})"


SOURCES = (
    ("init", "initial weights (model.init_seed)"),
    ("data", "data order (train.seed)"),
    ("residual", "interaction and run-to-run nondeterminism"),
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
            f"| source | sd | variance | {level}% interval (variance) | share | {level}% interval (share) |",
            "|---|---|---|---|---|---|",
        ]
        for key, name in SOURCES:
            c = n["components"][key]
            negative = " (estimate < 0, shown as 0)" if c["estimate"] < 0 else ""
            low, high = c["share_interval"]
            lines.append(
                f"| {name} | {c['sd']:.3g} | {c['variance']:.3g}{negative} | [{c['low']:.3g}, "
                f"{c['high']:.3g}] | {_fmt(c['share'] * 100, '.0f')}% | [{low * 100:.0f}%, {high * 100:.0f}%] |"
            )
    lines += [
        "",
        "- Two-way random-effects ANOVA without replication (one run per seed pair): variance from the "
        "initial weights, from the data order, and the rest. With one run per pair the rest holds the "
        "interaction of weights and data order together with any run-to-run nondeterminism (bf16, compile "
        "and atomics on a GPU are not bitwise deterministic); nothing here tells the two apart. Method-of-"
        "moments estimates; intervals exact (chi-square) for the rest and, for the two others, the modified "
        "large-sample interval for a difference of mean squares of Ting et al. (1990) as given by Burdick and "
        "Graybill (1992); the shares' intervals from generalized pivotal quantities (Weerahandi 1993). A few "
        "seeds give wide intervals: with 3 x 3 a share's interval often spans most of 0-100%.",
    ]
    return lines
