"""How long compare takes on a noise study: 4 norm types x 3 init seeds x 3 data seeds = 36 run folders.

    python tests/bench_compare.py [--repeat 3]

The run folders are synthetic (``tests/analysis/test_compare.py``'s ``make_run``: 100 metrics records each,
a test loss, a HellaSwag result over 1,000 items); the time is compare's own: reading them,
the statistics, the report, the JSON, runs.csv and the four charts; and ``--results`` on its runs.csv.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from analysis.test_compare import hellaswag_result, make_run  # noqa: E402

from gpt.analysis.table import compare  # noqa: E402

NORMS = ("handrolled_layernorm", "pytorch_layernorm", "handrolled_rmsnorm", "pytorch_rmsnorm")


def noise_study(root: Path) -> list[Path]:
    rng = np.random.default_rng(0)
    labels = [int(x) for x in rng.integers(0, 4, 1000)]
    paths = []
    for k, norm in enumerate(NORMS):
        for i in range(3):
            for j in range(3):
                loss = 3.3 + 0.01 * k + rng.normal(0, 0.003) + 0.002 * i - 0.001 * j
                path = make_run(root, f"{norm}-i{i}-s{j}", norm, j, float(loss), init_seed=i)
                answers = {m: [lab if rng.random() < 0.3 else (lab + 1) % 4 for lab in labels] for m in ("acc",)}
                ckpt = path / "checkpoints" / "step-00000100"
                (ckpt / "eval-hellaswag-fp32.json").write_text(json.dumps(hellaswag_result(labels, answers)))
                paths.append(path)
    return paths


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        paths = noise_study(Path(tmp) / "runs")
        for label, call in (
            ("36 run folders", lambda out: compare(paths, out, equivalence_margin=0.01)),
            ("--results runs.csv", lambda out: compare([], out, results=Path(tmp) / "c0" / "runs.csv")),
        ):
            times = []
            for r in range(args.repeat):
                start = time.perf_counter()
                call(Path(tmp) / f"c{r}" if label.startswith("36") else Path(tmp) / f"t{r}")
                times.append(time.perf_counter() - start)
            print(f"compare, {label}: " + ", ".join(f"{t:.2f} s" for t in times))


if __name__ == "__main__":
    main()
