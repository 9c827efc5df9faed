"""The fingerprint of a computation: recorded per segment, checked on resume, carried by evaluations;
the data's identity, checked when a split is opened."""

import json
import shutil
import subprocess

import numpy as np
import pytest
from conftest import ROOT, write_token_set, write_train_yaml

from gpt.config import load_config
from gpt.data.folders import open_split
from gpt.data.tokens import DataError, sample_digest
from gpt.evaluation.held_out import evaluate_checkpoint
from gpt.run import fastpath
from gpt.run.checkpoints import CheckpointError
from gpt.run.distributed import Dist
from gpt.run.fingerprint import code_version
from gpt.training.loop import train


def files_of(folder):
    """Every file's bytes but the lock's (it names the last process that held it)."""
    return {
        p.relative_to(folder): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file() and p.name != ".lock"
    }


@pytest.fixture(scope="module")
def own_data_run(tmp_path_factory, token_set):
    """(token set, run): a token set of its own and a completed 20-step run on it (checkpoints at 10 and 20),
    made once a module. Read them, never change them: ``own_data`` and ``trained`` give a test copies."""
    folder = tmp_path_factory.mktemp("own-data-run")
    data = write_token_set(folder / "tokens", n_train=60_000, n_val=4_000, n_test=4_000)
    yaml = write_train_yaml(folder, token_set, "fp")
    yaml.write_text(yaml.read_text().replace(str(token_set), str(data)))
    train(load_config(yaml))
    return data, folder / "fp"


@pytest.fixture
def own_data(own_data_run, tmp_path):
    """A token set this test may replace (the session's shared one must stay as it is)."""
    return shutil.copytree(own_data_run[0], tmp_path / "tokens")


@pytest.fixture
def trained(own_data_run, train_yaml, token_set, own_data, tmp_path):
    """A completed 20-step run on ``own_data`` (checkpoints at 10 and 20): a copy of the module's run, whose
    checkpoints read the module's tokens (the same bytes); returns (config path, run dir)."""
    yaml = train_yaml("fp")
    yaml.write_text(yaml.read_text().replace(str(token_set), str(own_data)))
    return yaml, shutil.copytree(own_data_run[1], tmp_path / "fp")


def step_10(run):
    return run / "checkpoints" / "step-00000010"


def refused(yaml, run, *fragments, overrides=()):
    """Resuming from step 10 is refused with a message holding ``fragments``, and nothing is written."""
    before = files_of(run)
    with pytest.raises(CheckpointError) as e:
        train(load_config(yaml, list(overrides)), resume=str(step_10(run)))
    message = str(e.value)
    assert "cannot be continued here, the run would compute something else from step 10" in message
    for fragment in fragments:
        assert fragment in message, message
    assert files_of(run) == before
    return message


def test_code_version_names_this_checkout():
    code = code_version()
    assert len(code["source"]) == 64 and code["version"] == "0.1.0"
    head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True)
    if head.returncode == 0:  # a git checkout (CI's clean clone is one)
        assert code["commit"] == head.stdout.strip() and isinstance(code["dirty"], bool)


def test_resume_on_other_data_is_refused(trained, own_data):
    yaml, run = trained
    old = json.loads((step_10(run) / "checkpoint.json").read_text())["segments"][0]["data"]["train"]
    write_token_set(own_data, n_train=60_000, n_val=4_000, n_test=4_000, seed=1)  # same sizes, other tokens
    new_train = sample_digest(own_data / "train.bin")
    assert new_train != old["sampled_sha256"]
    refused(
        yaml,
        run,
        f"data.train.sampled_sha256: checkpoint {old['sampled_sha256'][:12]}..., now {new_train[:12]}...",
        "data.train.sha256: checkpoint",
        "data.val.sha256: checkpoint",
    )


def test_resume_from_the_command_line_is_one_line_and_writes_nothing(trained, own_data, cli):
    yaml, run = trained
    write_token_set(own_data, n_train=60_000, n_val=4_000, n_test=4_000, seed=2)
    before = files_of(run)
    out = cli(ROOT / "train.py", yaml, "--resume", step_10(run))
    assert out.returncode == 2 and "Traceback" not in out.stderr and out.stderr.count("\n") == 1, out.stderr
    assert out.stderr.startswith("error: ") and "data.train.sha256: checkpoint" in out.stderr
    assert files_of(run) == before


def test_resume_under_another_resolved_precision_is_refused(train_yaml, tmp_path, monkeypatch):
    # precision: auto on a GPU with bf16, resumed where auto gives fp32 (a CPU here; a V100 in life)
    yaml = train_yaml("auto")
    monkeypatch.setattr(fastpath, "auto_precision", lambda device: "bf16")
    train(load_config(yaml, ["train.precision=auto"]))
    run = tmp_path / "auto"
    assert json.loads((run / "summary.json").read_text())["segments"][0]["train"]["precision"] == "bf16"
    monkeypatch.undo()
    refused(yaml, run, "train.precision: checkpoint bf16, now fp32", overrides=["train.precision=auto"])


@pytest.mark.parametrize(
    "key, value, said",
    [
        ("hardware.device", "cuda", "hardware.device: checkpoint cuda, now cpu"),
        ("train.tf32", True, "train.tf32: checkpoint true, now false"),
    ],
)
def test_resume_on_another_device_type_or_tf32_is_refused(trained, key, value, said):
    # a checkpoint written on a GPU (its checkpoint.json says so), resumed here on the CPU
    yaml, run = trained
    info_file = step_10(run) / "checkpoint.json"
    info = json.loads(info_file.read_text())
    section, name = key.split(".")
    info["segments"][0][section][name] = value
    info_file.write_text(json.dumps(info))
    refused(yaml, run, said)


def test_a_resume_that_changes_nothing_adds_a_segment(trained):
    yaml, run = trained
    shutil.rmtree(run / "checkpoints" / "step-00000020")
    (run / "checkpoints" / "latest").write_text("step-00000010\n")
    summary = train(load_config(yaml), resume="auto")
    assert [s["from_step"] for s in summary["segments"]] == [0, 10]
    assert json.loads((run / "summary.json").read_text())["segments"] == summary["segments"]
    final = json.loads((run / "checkpoints" / "step-00000020" / "checkpoint.json").read_text())
    assert final["segments"] == summary["segments"]


def test_an_evaluation_records_the_test_split_it_read(trained, own_data):
    _, run = trained
    result = evaluate_checkpoint(run / "checkpoints" / "step-00000020", Dist())
    recorded = json.loads((own_data / "meta.json").read_text())["splits"]["test"]
    fp = result["fingerprint"]
    assert fp["test"]["sha256"] == recorded["sha256"] and fp["test"]["sampled_sha256"] == recorded["sampled_sha256"]
    assert fp["precision"] == "fp32" and fp["hardware"]["device"] == "cpu" and fp["code"] == code_version()
    saved = json.loads((run / "checkpoints" / "step-00000020" / "eval-test-fp32.json").read_text())
    assert saved["fingerprint"] == json.loads(json.dumps(fp))


def test_a_split_changed_after_preparation_is_refused(own_data):
    assert len(open_split(own_data, "train")) == 60_000
    tokens = np.fromfile(own_data / "train.bin", dtype=np.uint16)
    tokens[123] ^= 1  # one token, same size
    tokens.tofile(own_data / "train.bin")
    with pytest.raises(
        DataError,
        match=r"train\.bin: not the file that was prepared \(its sampled sha256 differs "
        r"from the one recorded\): it changed after preparation; prepare the set "
        r"again with scripts/prepare_data\.py",
    ):
        open_split(own_data, "train")
    tokens[:1000].tofile(own_data / "val.bin")  # cut short
    with pytest.raises(
        DataError,
        match=r"val\.bin: not the file that was prepared \(1,000 tokens, meta\.json "
        r"records 4,000\)",
    ):
        open_split(own_data, "val")
    assert len(open_split(own_data, "test")) == 4_000


def test_the_sampled_digest_reads_a_large_file_in_blocks(tmp_path):
    import hashlib

    from gpt.data.tokens import SAMPLE_BLOCK, SAMPLE_BLOCKS

    small = tmp_path / "small.bin"
    small.write_bytes(bytes(range(256)) * 100)
    assert sample_digest(small) == hashlib.sha256((25_600).to_bytes(8, "little") + small.read_bytes()).hexdigest()
    big = tmp_path / "big.bin"
    size = SAMPLE_BLOCKS * SAMPLE_BLOCK * 3 + 5
    big.write_bytes(np.random.default_rng(0).integers(0, 256, size, dtype=np.uint8).tobytes())
    data = big.read_bytes()
    h = hashlib.sha256(size.to_bytes(8, "little"))
    for i in range(SAMPLE_BLOCKS):
        start = i * (size - SAMPLE_BLOCK) // (SAMPLE_BLOCKS - 1)
        h.update(data[start : start + SAMPLE_BLOCK])
    assert sample_digest(big) == h.hexdigest()
    changed = bytearray(data)
    changed[-1] ^= 0xFF  # the last byte is always read
    big.write_bytes(bytes(changed))
    assert sample_digest(big) != h.hexdigest()
