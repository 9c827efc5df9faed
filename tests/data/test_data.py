"""Reading token files lazily and batching them deterministically per rank."""

import json
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch
from conftest import ROOT, write_meta
from safetensors.numpy import save_file

from gpt.config import ConfigError, config_from_dict
from gpt.data.batches import TrainBatches
from gpt.data.folders import open_split, resolve_data_dir
from gpt.data.tokens import DataError, TokenFile, check_ids


@pytest.fixture
def token_dir(tmp_path):
    """train.bin holding 0, 1, 2, ... (mod 65536), so every token says where it came from."""
    (tmp_path / "train.bin").write_bytes(np.arange(10_000, dtype=np.uint16).tobytes())
    (tmp_path / "val.bin").write_bytes(np.arange(500, dtype=np.uint16).tobytes())
    write_meta(tmp_path, 1 << 16)
    return tmp_path


def reader(folder, **kw):
    args = dict(seq_len=8, micro_batch=2, global_batch=8, seed=1)
    args.update(kw)
    return TrainBatches(open_split(folder, "train"), **args)


def test_token_file_reads_ranges(token_dir):
    f = open_split(token_dir, "train")
    assert len(f) == 10_000 and f.dtype == np.uint16
    assert f.read(1234, 5).tolist() == [1234, 1235, 1236, 1237, 1238]
    assert f.read(9_999, 1).tolist() == [9_999]
    with pytest.raises(IndexError):
        f.read(9_999, 2)


def test_authors_safetensors_layout(tmp_path):
    tokens = (np.arange(3000, dtype=np.int64) * 7 % 50257).astype(np.int32)
    save_file({"tokens": tokens}, str(tmp_path / "validation.safetensors"), metadata={"source": "fineweb"})
    save_file({"tokens": tokens[:100].astype(np.uint16)}, str(tmp_path / "train.safetensors"))
    f = open_split(tmp_path, "validation")
    assert len(f) == 3000 and f.dtype == np.int32
    assert f.read(2990, 10).tolist() == tokens[2990:].tolist()
    assert open_split(tmp_path, "train").read(0, 100).tolist() == tokens[:100].tolist()
    batches = TrainBatches(f, seq_len=10, micro_batch=3, global_batch=3, shuffle=False)
    x, y = batches.batches(1)[0]
    assert (
        x.dtype == torch.int64 and x[0].tolist() == tokens[30:40].tolist() and y[0].tolist() == tokens[31:41].tolist()
    )
    save_file({"ids": tokens}, str(tmp_path / "other.safetensors"))
    with pytest.raises(DataError, match=r"other.safetensors: no 'tokens' tensor \(holds: ids\)"):
        TokenFile(tmp_path / "other.safetensors")


def test_missing_split_and_folder(token_dir, tmp_path):
    with pytest.raises(DataError, match=r"no split 'test' \(test.bin or test.safetensors\); splits here: train, val$"):
        open_split(token_dir, "test")
    with pytest.raises(
        DataError, match=r"nowhere: no such data directory \(prepare one with scripts/prepare_data.py\)"
    ):
        open_split(tmp_path / "nowhere", "train")
    (tmp_path / "odd.bin").write_bytes(b"\x00\x01\x02")
    with pytest.raises(DataError, match=r"odd.bin: 3 bytes is not a whole number of uint16 tokens"):
        TokenFile(tmp_path / "odd.bin")


def test_batches_are_inputs_and_next_token_targets(token_dir):
    r = reader(token_dir, shuffle=False)
    assert r.n_sequences == (10_000 - 1) // 8 and r.accum == 4 and r.steps_available == r.n_sequences // 8
    micro = r.next_step()
    assert len(micro) == 4
    x, y = micro[1]
    assert x.shape == y.shape == (2, 8)
    assert x[0].tolist() == list(range(16, 24)) and y[0].tolist() == list(range(17, 25))
    assert r.step == 1


def test_two_ranks_read_what_one_rank_reads_with_twice_the_accumulation(token_dir):
    one = reader(token_dir, micro_batch=2, global_batch=8, world_size=1)
    two = [reader(token_dir, micro_batch=2, global_batch=8, rank=r, world_size=2) for r in range(2)]
    assert one.accum == 4 and two[0].accum == 2
    for step in range(one.steps_available):
        single = [x for x, _ in one.next_step()]
        both = [x for r in two for x, _ in r.next_step()]
        assert len(single) == len(both) == 4
        for a, b in zip(single, both):
            assert torch.equal(a, b), step


def test_no_sequence_read_twice_and_order_depends_on_seed(token_dir):
    r = reader(token_dir, global_batch=4, micro_batch=4)
    firsts = [int(x[i, 0]) for _ in range(r.steps_available) for x, _ in r.next_step() for i in range(4)]
    assert len(firsts) == len(set(firsts)) == r.steps_available * 4
    assert all(f % 8 == 0 for f in firsts)  # whole sequences, starting at multiples of T
    assert firsts != sorted(firsts)  # shuffled
    other = reader(token_dir, global_batch=4, micro_batch=4, seed=2)
    assert [int(x[0, 0]) for x, _ in other.next_step()] != firsts[:1]
    again = reader(token_dir, global_batch=4, micro_batch=4)
    assert [int(x[i, 0]) for x, _ in again.next_step() for i in range(4)] == firsts[:4]


def test_state_restores_the_position(token_dir):
    a = reader(token_dir)
    for _ in range(5):
        a.next_step()
    state = json.loads(json.dumps(a.state_dict()))  # it is small and plain
    b = reader(token_dir)
    b.load_state_dict(state)
    for _ in range(3):
        for (xa, ya), (xb, yb) in zip(a.next_step(), b.next_step()):
            assert torch.equal(xa, xb) and torch.equal(ya, yb)
    with pytest.raises(DataError, match="cannot resume the data reader: seed was 1, now 2"):
        reader(token_dir, seed=2).load_state_dict(state)


def test_capacity_is_checked_before_training(token_dir):
    r = reader(token_dir, seq_len=100, micro_batch=4, global_batch=8)
    assert r.steps_available == 12  # 99 sequences of 100 tokens, 8 per step
    r.check_capacity(12)
    with pytest.raises(DataError) as e:
        r.check_capacity(13)
    assert str(e.value) == (
        f"{token_dir / 'train.bin'}: 10,000 tokens are 12 steps of 8 x 100 tokens, "
        "but the run asks for 13 steps (10,400 tokens); use a larger data set or fewer tokens"
    )
    assert r.token_range() == (0, 9_901)


def test_hub_repo_resolves_through_the_local_cache(tmp_path, monkeypatch):
    # the layout huggingface_hub keeps for a downloaded data set; offline, snapshot_download finds it
    repo = tmp_path / "cache" / "datasets--someone--tokens"
    snap = repo / "snapshots" / ("a" * 40)
    snap.mkdir(parents=True)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("a" * 40)
    save_file({"tokens": np.arange(50, dtype=np.uint16)}, str(snap / "train.safetensors"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    folder = resolve_data_dir(None, "someone/tokens", cache_dir=str(tmp_path / "cache"))
    assert open_split(folder, "train").read(40, 3).tolist() == [40, 41, 42]
    assert resolve_data_dir("data/x", None) == type(folder)("data/x")
    with pytest.raises(DataError, match="no data set: set data.path"):
        resolve_data_dir(None, None)
    with pytest.raises(DataError, match="^data.hub_repo someone/missing: cannot fetch: "):
        resolve_data_dir(None, "someone/missing", cache_dir=str(tmp_path / "cache"))


def test_data_config_ranges():
    base = {"run": {"name": "x"}, "train": {"steps": 1}}
    authors = config_from_dict(
        {
            **base,
            "data": {
                "hub_repo": "u/d",
                "val_split": "validation",
                "test_split": "validation",
                "test_offset": 50_000_000,
            },
        }
    )
    assert authors.data.val_tokens <= 50_000_000
    with pytest.raises(
        ConfigError,
        match=r"data.test_offset: the test range \[0, inf\) of split 'validation' "
        r"overlaps the validation range \[0, 4,194,304\)",
    ):
        config_from_dict({**base, "data": {"val_split": "validation", "test_split": "validation"}})
    with pytest.raises(ConfigError, match="data.train_split: 'test' is also the validation or test split"):
        config_from_dict({**base, "data": {"train_split": "test"}})
    with pytest.raises(ConfigError, match="data.hub_repo: set data.path or data.hub_repo, not both"):
        config_from_dict({**base, "data": {"path": "d", "hub_repo": "u/d"}})


@pytest.mark.slow
def test_memory_does_not_grow_with_the_data_set(tmp_path):
    # 1 GB of tokens; 200 global steps of 64 x 1024 shuffled sequences (13M tokens read)
    path = tmp_path / "train.bin"
    block = (np.arange(1 << 24, dtype=np.uint32) % 50257).astype(np.uint16)  # 32 MB
    with open(path, "wb") as f:
        for _ in range(32):
            f.write(block.tobytes())
    assert path.stat().st_size == 1 << 30
    write_meta(tmp_path, 50257)
    code = textwrap.dedent(f"""
        import resource
        from gpt.data.batches import TrainBatches
        from gpt.data.folders import open_split
        r = TrainBatches(open_split({str(tmp_path)!r}, "train"), seq_len=1024, micro_batch=16,
                         global_batch=64, seed=0)
        r.next_step()  # warm up allocations of one step
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        total = 0
        for _ in range(200):
            for x, y in r.next_step():
                total += int(x[:, 0].sum())
        after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        print((after - before) // 1024, r.step)
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert out.returncode == 0, out.stderr
    grew_mb, steps = map(int, out.stdout.split())
    assert steps == 201
    assert grew_mb < 100, f"peak RSS grew by {grew_mb} MB"


@pytest.mark.parametrize("n", [1, 2, 3, 7, 64, 65, 1249, 100_003])
def test_feistel_permutation_visits_everything_once(n):
    from gpt.data.batches import FeistelPermutation

    out = FeistelPermutation(n, seed=5)(np.arange(n))
    assert np.array_equal(np.sort(out), np.arange(n))
    assert np.array_equal(FeistelPermutation(n, seed=5)(np.arange(n)), out)  # a pure function of the seed
    if n > 64:
        assert not np.array_equal(FeistelPermutation(n, seed=6)(np.arange(n)), out)


def test_consecutive_batches_are_not_shifted_copies(token_dir):
    r = reader(token_dir, global_batch=16, micro_batch=16)
    ids = [r.sequence_ids(s) for s in range(r.steps_available)]
    seen = np.concatenate(ids)
    assert len(seen) == len(set(seen.tolist())) == r.steps_available * 16  # every sequence at most once
    for a, b in zip(ids, ids[1:]):
        offsets = (b - a) % r.n_sequences  # an affine order gives one offset for the whole batch
        assert len(set(offsets.tolist())) > 12
    # and on any world size the ranks' slices make up the same global batch
    ranks = [reader(token_dir, global_batch=16, micro_batch=4, rank=k, world_size=4) for k in range(4)]
    for s in (0, 1, r.steps_available - 1):
        assert np.array_equal(np.concatenate([q.sequence_ids(s) for q in ranks]), ids[s])


def test_a_checkpoint_of_the_earlier_affine_order_is_not_resumed(token_dir):
    state = reader(token_dir).state_dict()
    assert state["order"] == "feistel-6"
    del state["order"]  # what the earlier version wrote
    with pytest.raises(DataError, match="cannot resume the data reader: order was 'affine', now 'feistel-6'"):
        reader(token_dir).load_state_dict(state)


def test_the_first_token_id_without_an_embedding_is_refused():
    # ids run 0..vocab_size-1: vocab_size itself is the first one the embedding lacks (on a GPU, a device assert)
    check_ids(torch.tensor([[0, 255]]), 256, "train.bin")
    with pytest.raises(DataError, match=r"train.bin: token id 256 is >= model.vocab_size 256"):
        check_ids(torch.tensor([[0, 256]]), 256, "train.bin")
