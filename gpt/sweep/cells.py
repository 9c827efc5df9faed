"""The layout of a sweep: which runs (cells) a grid of norm types x seeds (x learning rates) holds, and their names.

Each cell has a predictable run directory, ``<runs_dir>/<config stem>-<norm-type>-s<seed>``
(one seed for the initial weights and the data order), or, where the two are crossed to
split the noise between them, ``<config stem>-<norm-type>-i<init seed>-s<data seed>``. A sweep over
learning rates (``--lrs``) puts each cell's rate before its seeds: ``<config stem>-<norm-type>-lr1.4e-3-s<seed>``
(the rate's shortest exact decimal, in scientific form). A sweep across model sizes (``--sizes``, named in
``gpt.config.sizes``) puts the size after the config's stem: ``<config stem>-<size>-<norm-type>-s<seed>``, each
cell trained on ``train.tokens_per_param`` x its own parameters. A factor crossed with the norm types
(``--vary optim.name=adamw,muon``) names each cell's level after its norm type:
``<config stem>-<norm-type>-muon-s<seed>`` (one word per factor, in their order). Every cell's config is resolved
and validated here, before anything runs.
"""

from __future__ import annotations

import itertools
import math
import re
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path

from gpt.analysis.scaling import NEEDS, seed_order
from gpt.analysis.selection import LR_KEY
from gpt.common.errors import UserError
from gpt.common.files import read_json
from gpt.config import DEFAULT_BASELINE, Config, load_config, norm_order
from gpt.config.architecture import SEED_MAX, label_keys
from gpt.config.sizes import SIZE_KEY, SIZES, mixed_shapes
from gpt.run.directory import COMPARISON_FILE, RunDir


@dataclass
class Cell:
    """One run of the grid."""

    norm_type: str  # the norm type it trains
    seed: int  # its train.seed (the data order; its cfg's model.init_seed, when set, the initial weights)
    name: str  # its run.name, also its folder's name
    cfg: Config  # its resolved config
    overrides: list[str]  # the --set overrides that make the sweep's config this cell's

    @property
    def run(self) -> RunDir:
        return RunDir(self.cfg.run_dir)


MIN_LR_KEY = "optim.min_lr"  # the floor that follows a learning-rate sweep's axis (LR_KEY)
MUON_LR_KEY = "optim.muon_lr"  # Muon's rate, which follows it too (AdamW cells read it as its default)


def lr_text(lr: float) -> str:
    """A learning rate as a folder name spells it: its shortest exact decimal in scientific form, without
    ``+`` (0.0014 -> ``1.4e-3``, 7e-4 -> ``7e-4``, 1.0 -> ``1e0``)."""
    return format(Decimal(repr(float(lr))).normalize(), "e").replace("+", "")


def cell_name(
    config: Path,
    norm_type: str,
    seed: int,
    init_seed: int | None = None,
    lr: float | None = None,
    size: str = "",
    fraction: float | None = None,
    level: str = "",
) -> str:
    init = "" if init_seed is None else f"-i{init_seed}"
    rate = "" if lr is None else f"-lr{lr_text(lr)}"
    sized = f"-{size}" if size else ""
    part = "" if fraction is None else f"-t{fraction:g}"
    norms = norm_type.replace("_", "-").replace("+", "-").replace(":", "-")  # a label with sites: each named
    crossed = f"-{level}" if level else ""
    return f"{Path(config).stem}{sized}-{norms}{crossed}{rate}{part}{init}-s{seed}"


# keys a factor may not be: the grid's own axes have their flags
AXIS_FLAGS = {"model.norm_type": "--norm-types", "train.seed": "--seeds", "model.init_seed": "--init-seeds",
              LR_KEY: "--lrs", SIZE_KEY: "--sizes"}  # fmt: skip


def parse_factors(factors: list[str] | None, overrides: list[str] = ()) -> list[tuple[str, list[str]]]:
    """``--vary KEY=A,B[,...]`` as (key, levels) pairs, refused in one line where it cannot be a factor: not of that
    form, fewer than two different levels, a key named twice, set by --set too, or an axis with its own flag."""
    out: list[tuple[str, list[str]]] = []
    for text in factors or []:
        key, sep, values = text.partition("=")
        key, levels = key.strip(), [v.strip() for v in values.split(",")]
        if not sep or not key or len(levels) < 2 or "" in levels or len(set(levels)) != len(levels):
            raise UserError(f"--vary {text}: give KEY=A,B (a config key, then two or more different values)")
        if key in AXIS_FLAGS or key.startswith("run."):
            raise UserError(f"--vary {key}: the grid has {AXIS_FLAGS.get(key, 'its own run names')} for that")
        if any(k == key for k, _ in out) or sets_key(list(overrides), key):
            raise UserError(f"--vary {key}: named twice (by --vary or --set); give each key once")
        out.append((key, levels))
    return out


def levels(factors: list[tuple[str, list[str]]]) -> list[tuple[tuple[str, str], ...]]:
    """Every level of the crossed factors, their product in order, each as its (key, value) pairs; one empty level
    without factors."""
    return list(itertools.product(*[[(key, v) for v in values] for key, values in factors]))


def level_parts(factors: list[tuple[str, list[str]]]) -> list[tuple[str, list[str]]]:
    """Every level (``levels``) as (its word in a folder name, its --set overrides)."""
    return [("-".join(re.sub(r"[^A-Za-z0-9.]+", "-", v) for _, v in combo), [f"{k}={v}" for k, v in combo])
            for combo in levels(factors)]  # fmt: skip


def trains_muon(optimizer: str, factors: list[tuple[str, list[str]]] | None) -> bool:
    """Whether a cell of a grid whose config (with its --set) names ``optimizer`` trains with Muon: that, or a
    level of optim.name."""
    named = {v for key, values in factors or [] if key == "optim.name" for v in values}
    return "muon" in {optimizer, *named}


def following(overrides: list[str], muon: bool) -> list[str]:
    """The keys that move with a learning-rate axis, at the config's ratio to optim.lr, unless --set fixes them:
    optim.min_lr, and optim.muon_lr where a cell trains with ``muon`` (an AdamW cell reads it as its default)."""
    return [key for key in (MIN_LR_KEY, *([MUON_LR_KEY] if muon else [])) if not sets_key(overrides, key)]


def sets_key(overrides: list[str], key: str) -> bool:
    """Whether one of the sweep's ``--set KEY=VALUE`` overrides sets ``key``."""
    return any(o.partition("=")[0].strip() == key for o in overrides)


def rate_overrides(
    config: Path, overrides: list[str], lrs: list[float] | None, factors: list[tuple[str, list[str]]] | None = None
) -> list[list[str]]:
    """Each learning rate's ``--set`` overrides (``[[]]`` without ``lrs``): optim.lr, and the keys that follow it
    (``following``: optim.min_lr, and optim.muon_lr where a cell of the config or a level of ``factors`` trains
    with Muon) at the config's ratio to optim.lr."""
    if not lrs:
        return [[]]
    if sets_key(overrides, LR_KEY):
        raise UserError(f"--lrs sets {LR_KEY} of every cell; drop --set {LR_KEY}=...")
    names = [lr_text(lr) for lr in lrs]
    if len(set(names)) != len(names):
        raise UserError(f"--lrs {' '.join(names)} names a learning rate twice")
    optim = load_config(config, overrides).optim  # an AdamW config's muon_lr: the default, what Muon cells get
    ratios = {MIN_LR_KEY: optim.min_lr, MUON_LR_KEY: optim.muon_lr}
    follow = [(key, ratios[key]) for key in following(overrides, trains_muon(optim.name, factors))]
    out = []
    for lr in lrs:
        # 12 digits: no 1.4000000000000001e-4
        moved = [f"{key}={float(f'{lr * value / optim.lr:.12g}')!r}" for key, value in follow]
        out.append([f"{LR_KEY}={float(lr)!r}", *moved])
    return out


def seed_pairs(
    seeds: list[int], init_seeds: list[int] | None = None, data_seeds: list[int] | None = None
) -> list[tuple[int | None, int]]:
    """(init seed, data seed) of each cell of one norm type: ``seeds`` as (None, seed), or, with both
    ``init_seeds`` and ``data_seeds``, every pair of them crossed."""
    if (init_seeds is None) != (data_seeds is None):
        raise UserError(
            "--init-seeds and --data-seeds go together: every initialisation seed is trained with every data-order seed"
        )
    if init_seeds is None:
        return [(None, s) for s in seeds]
    for flag, values in (("--init-seeds", init_seeds), ("--data-seeds", data_seeds)):
        if len(set(values)) < 2:
            raise UserError(
                f"{flag} needs at least two different seeds to split the noise (got {' '.join(map(str, values))})"
            )
    return [(i, dist) for i in init_seeds for dist in data_seeds]


def lay_out(
    config: Path,
    norm_types: list[str],
    seeds: list[int],
    runs_dir: Path,
    overrides: list[str] = (),
    seeds_for: dict[str, list[int]] | None = None,
    init_seeds: list[int] | None = None,
    data_seeds: list[int] | None = None,
    lrs: list[float] | None = None,
    sizes: list[str] | None = None,
    factors: list[tuple[str, list[str]]] | None = None,
) -> list[Cell]:
    """Every cell's resolved config, validated before anything runs. ``seeds_for`` gives some norm
    types other seeds than ``seeds``; ``init_seeds`` with ``data_seeds`` cross the two instead; ``lrs``
    crosses the grid with learning rates (``rate_overrides``); ``sizes`` with model sizes, in their order
    (``check_sizes``); ``factors`` with every level of other config keys (``parse_factors``)."""
    cells = []
    rates = rate_overrides(config, list(overrides), lrs, factors)
    check_sizes(config, list(overrides), sizes)
    for size in sizes or [None]:
        for norm_type, (word, level) in itertools.product(norm_types, level_parts(factors or [])):
            for lr, rate in zip(lrs or [None], rates):
                for init, seed in seed_pairs((seeds_for or {}).get(norm_type, seeds), init_seeds, data_seeds):
                    name = cell_name(config, norm_type, seed, init, lr, size, level=word)
                    sized = [] if size is None else [f"{SIZE_KEY}={size}"]
                    keys = _cell_keys(norm_type, seed, init, name, runs_dir)
                    cell_overrides = [*overrides, *sized, *level, *rate, *keys]
                    cells.append(Cell(norm_type, seed, name, load_config(config, cell_overrides), cell_overrides))
    names = [c.name for c in cells]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise UserError(f"--vary: two levels spell one folder name ({', '.join(twice)}); give values that differ "
                        "in letters or digits")  # fmt: skip
    return cells


def _cell_keys(norm_type: str, seed: int, init: int | None, name: str, runs_dir: Path) -> list[str]:
    """The overrides that make a cell its own: its norm type (and any site's own: ``norm_label``), seeds, name and
    folder."""
    return [
        *(f"model.{key}={value}" for key, value in label_keys(norm_type).items()),
        f"train.seed={seed}",
        *([f"model.init_seed={init}"] if init is not None else []),
        f"run.name={name}",
        f"run.dir={Path(runs_dir) / name}",
    ]


def ladder_norm(norm_types: list[str], baseline: str | None) -> str:
    """The norm type a token ladder trains: the comparison's baseline (``--baseline``, else its default rule)."""
    if baseline is not None:
        if baseline not in norm_types:
            raise UserError(
                f"--baseline {baseline}: the token ladder trains the baseline, and the sweep's norm types are "
                f"{' '.join(norm_types)}; name one of them"
            )
        return baseline
    return DEFAULT_BASELINE if DEFAULT_BASELINE in norm_types else min(norm_types, key=norm_order)


def fraction_overrides(config: Path, overrides: list[str], fraction: float) -> list[str]:
    """The ``--set`` that trains ``fraction`` of the config's token budget, as it states its length (train.steps,
    train.tokens or train.tokens_per_param): a complete run with its own schedule (warmup and decay by fraction)."""
    t = load_config(config, list(overrides)).train
    if t.steps is not None:
        return [f"train.steps={max(1, round(fraction * t.steps))}"]
    if t.tokens is not None:
        return [f"train.tokens={max(1, round(fraction * t.tokens))}"]
    return [f"train.tokens_per_param={float(f'{fraction * t.tokens_per_param:.12g}')!r}"]


def check_fractions(fractions: list[float] | None, sizes, lrs, init_seeds, confirm_seeds) -> None:
    """Refuse, before anything runs, a token ladder that cannot be one: a fraction not positive and finite, one
    named twice, none but the budget itself, or beside another axis that changes what the baseline's curve is."""
    if fractions is None:
        return
    bad = [f for f in fractions if not (math.isfinite(f) and 0 < f <= MAX_FRACTION)]
    if bad:
        raise UserError(
            f"--token-fractions {' '.join(map(str, bad))}: a fraction of the token budget, > 0 and <= {MAX_FRACTION:g}"
        )
    names = [f"{f:g}" for f in fractions]
    if len(set(names)) != len(names):
        raise UserError(f"--token-fractions {' '.join(names)} names a fraction twice")
    if not off_budget(fractions):
        raise UserError("--token-fractions 1 is the budget the grid trains already: give other fractions too (0.5 2)")
    for flag, given in (
        ("--sizes", sizes),
        ("--lrs", lrs),
        ("--init-seeds", init_seeds),
        ("--confirm-seeds", confirm_seeds),
    ):
        if given:
            raise UserError(
                f"--token-fractions with {flag}: the token ladder is the baseline's curve at one size, one rate, "
                "one seed per run"
                + (
                    "; across sizes the size ladder is the curve already (drop --token-fractions)"
                    if flag == "--sizes"
                    else ""
                )
            )


MAX_FRACTION = 16.0  # a token ladder's longest rung, in token budgets


def off_budget(fractions: list[float]) -> list[float]:
    """The fractions a token ladder trains: all but the budget itself (1, as its name spells it: the grid's cell)."""
    return [f for f in fractions if f"{f:g}" != "1"]


def ladder_cells(
    config: Path, norm_type: str, seeds: list[int], runs_dir: Path, overrides: list[str], fractions: list[float]
) -> list[Cell]:
    """The token ladder: ``norm_type`` (the baseline) trained to each of ``fractions`` of the token budget (the
    budget itself, 1, is the grid's own cell) with each seed, ``<config stem>-<norm-type>-t<fraction>-s<seed>``."""
    cells = []
    for fraction in off_budget(fractions):
        length = fraction_overrides(config, overrides, fraction)
        for seed in seeds:
            name = cell_name(config, norm_type, seed, fraction=fraction)
            cell_overrides = [*overrides, *length, *_cell_keys(norm_type, seed, None, name, runs_dir)]
            cells.append(Cell(norm_type, seed, name, load_config(config, cell_overrides), cell_overrides))
    return cells


def check_size_axis(sizes: list[str] | None, confirm_seeds: list[int] | None, predict_at: float | None) -> None:
    """Refuse what a sweep cannot do with (or without) a size axis: a prediction with no sizes to fit, and a
    confirmation stage per size (not built: each size's rate is chosen on its own grid, and said optimistic)."""
    if predict_at is not None and len(sizes or ()) < NEEDS["power"]:
        raise UserError(
            f"--predict-at predicts from a fit across sizes: give --sizes with {NEEDS['power']} or more "
            f"({NEEDS['saturating']} or more for E + A*N^-alpha); {len(sizes or ())} given"
        )
    mixed = mixed_shapes(sizes) if sizes and all(s in SIZES for s in sizes) else None
    if mixed:
        raise UserError(f"--sizes {' '.join(sizes)}: {mixed}; take the sizes from one ladder (gpt.config.sizes)")
    if sizes and confirm_seeds:
        raise UserError(
            "--confirm-seeds with --sizes: a confirmation stage per size is not built; sweep --sizes with --lrs "
            "(each size's rate chosen on validation, its intervals said optimistic), then train the chosen rates on "
            "fresh seeds with --set optim.lr=... per size"
        )


def check_sizes(config: Path, overrides: list[str], sizes: list[str] | None) -> None:
    """Refuse, before anything runs, a size axis that cannot be one: an unknown or repeated size, a size set by
    ``--set`` as well, or a config that does not train each size by ``train.tokens_per_param`` (so the sizes
    would not each train by the same rule)."""
    if sizes is None:
        return
    unknown = [s for s in sizes if s not in SIZES]
    if unknown:
        raise UserError(f"--sizes {' '.join(unknown)}: not a named size; sizes: {' '.join(SIZES)} (gpt.config.sizes)")
    if len(set(sizes)) != len(sizes):
        raise UserError(f"--sizes {' '.join(sizes)} names a size twice")
    if sets_key(overrides, SIZE_KEY):
        raise UserError(f"--sizes sets {SIZE_KEY} of every cell; drop --set {SIZE_KEY}=...")
    train = load_config(config, [*overrides, f"{SIZE_KEY}={sizes[0]}"]).train
    if train.tokens_per_param is None:
        length = f"train.steps={train.steps}" if train.steps is not None else f"train.tokens={train.tokens}"
        raise UserError(
            f"--sizes trains each size on train.tokens_per_param x its own parameters (one rule for every size), "
            f"and the config sets {length}: add --set {length.partition('=')[0]}=null --set "
            "train.tokens_per_param=20 (Chinchilla's), or another number of tokens per parameter"
        )


def comparison_folder(config: Path, runs_dir: Path, out: Path | None = None) -> Path:
    """Where the sweep's comparison goes: ``out``, or ``<runs_dir>/<config stem>-comparison``."""
    return Path(out) if out is not None else Path(runs_dir) / f"{Path(config).stem}-comparison"


def check_confirmation_kept(out: Path, confirm_seeds: list[int] | None) -> None:
    """Refuse, before anything trains, a two-stage sweep whose confirmation would replace a comparison made on
    other seeds in ``out`` (an earlier --confirm-seeds): that result would then be in no report."""
    file = Path(out) / COMPARISON_FILE
    if not confirm_seeds or not file.is_file():
        return
    try:
        groups = read_json(file, "comparison").get("groups")
    except UserError:
        return  # a damaged record: the comparison rewrites it, as it would without a sweep
    seeds = {
        str(r.get("seed"))
        for row in (groups if isinstance(groups, list) else [])
        if isinstance(row, dict)
        for r in [*(row.get("runs") or []), *(row.get("left_out") or [])]
        if isinstance(r, dict)
    }
    wanted = {str(k) for k in confirm_seeds}
    if seeds and seeds != wanted:
        held = " ".join(sorted(seeds, key=seed_order))
        raise UserError(
            f"{out} holds the comparison of seeds {held}; --confirm-seeds {' '.join(map(str, confirm_seeds))} would "
            f"replace it: give --out another folder (or move it aside), or rerun with --confirm-seeds {held}"
        )


def selection_folder(comparison: Path) -> Path:
    """Where a two-stage sweep's selection (the grid's comparison, which chooses the rates) goes: beside its
    comparison, ``<comparison>-selection``."""
    return comparison.with_name(f"{comparison.name}-selection")


def check_rates(
    confirm_seeds: list[int] | None, lrs: list[float] | None, seeds: list[int], init_seeds: list[int] | None
) -> None:
    """Refuse, before anything runs, a rate axis with nothing to choose, and confirmation seeds that cannot
    confirm: without rates to choose, crossed seeds, or a seed the rates were chosen on (its runs would carry the
    choice's luck)."""
    if lrs is not None and len(lrs) < 2:
        raise UserError(
            f"--lrs {lr_text(lrs[0])}: one rate leaves nothing to choose; give two or more, or train at one rate "
            f"with --set optim.lr={float(lrs[0])!r} instead of --lrs"
        )
    if not confirm_seeds:
        return
    if not lrs or len(lrs) < 2:
        raise UserError(
            "--confirm-seeds trains the rates chosen among --lrs on fresh seeds; give --lrs two or more rates"
        )
    if init_seeds is not None:
        raise UserError(
            "--confirm-seeds works with --seeds (a seed of both init and data), not --init-seeds/--data-seeds"
        )
    wrong = [k for k in confirm_seeds if not 0 <= k <= SEED_MAX]
    if wrong:
        raise UserError(
            f"--confirm-seeds {' '.join(map(str, wrong))}: a seed is an integer from 0 to {SEED_MAX} (train.seed)"
        )
    if len(set(confirm_seeds)) < 2:
        seeds_given = " ".join(map(str, confirm_seeds))
        raise UserError(f"--confirm-seeds needs two or more different seeds for an interval (got {seeds_given})")
    reused = sorted(set(confirm_seeds) & set(seeds))
    if reused:
        raise UserError(
            f"--confirm-seeds {' '.join(map(str, reused))} also chose the rates (--seeds): confirmation seeds must "
            "be fresh, or their runs carry the choice's luck"
        )
