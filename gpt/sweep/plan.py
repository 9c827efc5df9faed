"""``sweep.py --plan``: what a sweep would run and what it can detect, before anything runs.

The cells are laid out as the sweep lays them out (every refusal included); each size's parameter count is the
one train.tokens_per_param multiplies, counted on the meta device (no weights drawn, seconds for GPT-2 small);
the power is ``gpt.analysis.power``'s at the noise of a named comparison (``--noise-from``), a given sd
(``--noise``) or the stated default.
"""

from __future__ import annotations

import math

from gpt.analysis import power
from gpt.common.errors import UserError
from gpt.sweep.cells import Cell, off_budget, parse_factors
from gpt.sweep.spec import SweepSpec


def size_counts(cells: list[Cell]) -> dict[str, int]:
    """Each size's parameters outside the norm layers among ``cells`` (a sweep across sizes), smallest first."""
    import torch

    from gpt.model.gpt import GPT

    counts = {}
    for cell in cells:
        size = cell.cfg.model.size
        if size not in counts:
            with torch.device("meta"):  # shapes only
                counts[size] = GPT(cell.cfg.model, seed=None).num_params(norms=False)
    return dict(sorted(counts.items(), key=lambda kv: kv[1]))


def plan_lines(spec: SweepSpec, args) -> str:
    """The sweep's cells and its power, as text to print (``args``: the command's, ``power.add_arguments``')."""
    noise_from, noise, detect, detect_trend = (getattr(args, k) for k in power.PLAN_KEYS)
    if spec.init_seeds:
        raise UserError(
            "--plan with --init-seeds/--data-seeds: the plan is of independent seeds (a paired t test over them); "
            "plan with --seeds"
        )
    if noise_from is not None and noise is not None:
        raise UserError("--noise-from and --noise: give one (a comparison to read the noise from, or the sd itself)")
    if noise is not None:
        sd, source = noise, "given by --noise"
    elif noise_from is not None:
        sd, source = power.noise_from(noise_from)
    else:
        sd, source = power.DEFAULT_SD, "the default, an assumption: --noise-from a comparison of yours measures it"
    seeds = len(spec.confirm_seeds) if spec.confirm_seeds else len(spec.seeds)
    cells = spec.grid_cells()  # each cell's config resolved once: the count and the sizes' parameters
    counts = size_counts(cells) if spec.sizes else None
    levels = math.prod(len(values) for _, values in parse_factors(spec.factors))
    confirm = len(spec.norm_types) * levels * seeds if spec.confirm_seeds else 0
    then = f", then {confirm} confirmation cell(s)" if confirm else ""
    ladder = spec.ladder_cells()
    if ladder:
        work = sum(off_budget(spec.token_fractions)) * len(spec.seeds)
        then += f", and the baseline's token ladder: {len(ladder)} cell(s), {work:.3g} budget runs of compute"
    out = [f"# plan: {len(cells)} cell(s){then}; nothing run"]
    if counts:
        out.append("# sizes (parameters outside the norms): " + ", ".join(f"{k} {v:,}" for k, v in counts.items()))
    tested = "the confirmation seeds" if spec.confirm_seeds else "the seeds"
    out.append(f"# each question is tested over {tested}, paired by seed with the baseline")
    p = power.plan(sd, seeds, list(counts.values()) if counts else None, detect, detect_trend, bool(spec.factors))
    return "\n".join(out + power.lines(p, source))
