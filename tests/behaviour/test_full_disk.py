"""Out of space and over a file-size limit: every file the package writes is written whole or not at all.

Each test reproduces the fault (a real full disk: a small tmpfs, filled; a file-size limit: ``ulimit -f``
in a subprocess) and asserts the outcome: one line naming the file and the operating system's reason,
no traceback, every file that was there before byte-identical, and nothing half-written left beside it.
"""

import errno
import json
import os
import subprocess
import tempfile

import pytest
from analysis.test_compare import make_run
from conftest import ROOT
from test_faults import files_of, limit_file_size, one_line_error, run_cli

from gpt.common.files import HOST, WriteError, replacing, replacing_folder, write_atomically
from gpt.config import load_config
from gpt.training.loop import train

FILE_TOO_LARGE = os.strerror(errno.EFBIG)  # "File too large"
NO_SPACE = os.strerror(errno.ENOSPC)  # "No space left on device"


class Disk:
    """A tmpfs of its own (4 MiB), mounted for one test; ``fill()`` takes every byte left."""

    def __init__(self, path):
        self.path = path

    def fill(self):
        with open(self.path / "filler", "ab", buffering=0) as f:
            for size in (65536, 4096, 1):  # to the last byte of the last page
                try:
                    while True:
                        f.write(b"\0" * size)
                except OSError as e:
                    assert e.errno == errno.ENOSPC


@pytest.fixture
def disk(tmp_path):
    mount = tmp_path / "disk"
    mount.mkdir()
    out = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(mount)], capture_output=True, text=True)
    if out.returncode != 0:
        pytest.skip(f"a full disk needs a tmpfs of its own, and mount refused ({out.stderr.strip()}): run as root")
    try:
        yield Disk(mount)
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=True)


def leftovers(folder):
    """Temporary files a write left behind (gpt.common.files names them .NAME.tmp-PID-...)."""
    return sorted(p.name for p in folder.rglob(".*.tmp-*"))


# ----------------------------------------------------------------------------- the writer itself


def test_the_writer_replaces_whole_or_leaves_the_file_as_it_was(disk):
    path = disk.path / "result.json"
    write_atomically(path, "first\n")
    os.chmod(path, 0o640)
    write_atomically(path, "second\n")
    assert path.read_text() == "second\n" and (path.stat().st_mode & 0o777) == 0o640  # a replacement keeps the mode
    with pytest.raises(RuntimeError), replacing(path) as tmp:  # a writer that fails half-way
        tmp.write_text("half")
        raise RuntimeError("the writer's own bug")
    assert path.read_text() == "second\n" and leftovers(disk.path) == []
    disk.fill()
    with pytest.raises(WriteError) as e:
        write_atomically(path, "x" * 100_000)
    assert str(e.value) == f"cannot write {path}: {NO_SPACE}" and e.value.reason == NO_SPACE
    assert path.read_text() == "second\n" and leftovers(disk.path) == []
    with (
        pytest.raises(WriteError, match=f"cannot write {disk.path / 'set'}: {NO_SPACE}"),
        replacing_folder(disk.path / "set") as tmp,
    ):
        (tmp / "train.bin").write_bytes(b"\1" * 100_000)
    assert not (disk.path / "set").exists() and sorted(p.name for p in disk.path.iterdir()) == [
        "filler",
        "result.json",
    ]


def test_a_killed_writers_temporary_files_are_removed_by_the_next_write(tmp_path):
    path = tmp_path / "summary.json"
    abandoned = tmp_path / f".summary.json.tmp-{HOST}-999999999-abc"  # a PID that runs nowhere
    alive = tmp_path / f".summary.json.tmp-{HOST}-{os.getppid()}-abc"  # a live writer's: left to it
    elsewhere = tmp_path / ".summary.json.tmp-othermachine-999999999-abc"  # on a shared disk: not ours to judge
    for p in (abandoned, alive, elsewhere):
        p.write_text("{half")
    write_atomically(path, "{}\n")
    assert not abandoned.exists() and alive.exists() and elsewhere.exists() and path.read_text() == "{}\n"
    # a folder moved aside by a kill between the two renames of its replacement: the last whole one, taken back
    aside = tmp_path / f".tokens.old-{HOST}-999999999-abc"
    aside.mkdir()
    (aside / "meta.json").write_text("{}")
    (tmp_path / f".tokens.tmp-{HOST}-999999999-def").mkdir()  # the new one, never renamed in: removed
    with pytest.raises(RuntimeError), replacing_folder(tmp_path / "tokens"):
        raise RuntimeError("a writer that fails")
    assert sorted(p.name for p in tmp_path.iterdir() if "tokens" in p.name) == ["tokens"]
    assert (tmp_path / "tokens" / "meta.json").read_text() == "{}"


# ------------------------------------------------------------------------------------ evaluation


@pytest.mark.slow
def test_a_failed_rewrite_never_destroys_an_evaluation_result(tiny_run_copy, tmp_path):
    run = tiny_run_copy("evaluated")
    ckpt = run / "checkpoints" / "step-00000020"
    args = [ROOT / "evaluate.py", run, "--offset", "0", "--tokens", "8192", "--quiet"]
    first = run_cli(*args, "--json", tmp_path / "all.json")
    assert first.returncode == 0, first.stderr
    result = ckpt / "eval-test-0-8192-fp32.json"
    before = files_of(run) | {"all.json": (tmp_path / "all.json").read_bytes()}
    assert json.loads(result.read_text())["loss"] > 0 and len(result.read_bytes()) > 1024
    # the same range again under a 1 KB file-size limit: the result stays, the numbers are printed
    again = run_cli(*args, preexec_fn=limit_file_size(1024))
    assert again.returncode == 0 and "Traceback" not in again.stderr, again.stderr
    assert again.stderr == (
        f"warning: cannot keep the result in {result}: {FILE_TOO_LARGE}; it is printed, and --json FILE "
        "writes it where you choose\n"
    )
    assert f"{json.loads(result.read_text())['loss']:.6f}" in again.stdout
    # --json to a file that cannot be written whole: one line (after the result's warning), the earlier file kept
    out = run_cli(*args, "--json", tmp_path / "all.json", preexec_fn=limit_file_size(1024))
    assert out.returncode == 2 and out.stderr.splitlines()[1:] == [
        f"error: cannot write {tmp_path / 'all.json'}: {FILE_TOO_LARGE}"
    ], out.stderr
    assert files_of(run) | {"all.json": (tmp_path / "all.json").read_bytes()} == before
    assert leftovers(tmp_path) == []


def test_evaluation_on_a_full_disk_keeps_nothing_half_written(tiny_run_copy, disk, capsys):
    from gpt.commands.evaluate import main as evaluate

    run = tiny_run_copy("full", where=disk.path)
    ckpt = run / "checkpoints" / "step-00000020"
    assert evaluate([str(run), "--quiet", "--offset", "0", "--tokens", "4096"]) == 0
    capsys.readouterr()
    disk.fill()
    before = files_of(run)
    assert evaluate([str(run), "--quiet"]) == 0  # a new result: printed, not kept, and no empty file
    err = capsys.readouterr().err
    assert err == (
        f"warning: cannot keep the result in {ckpt / 'eval-test-fp32.json'}: {NO_SPACE}; it is printed, and "
        "--json FILE writes it where you choose\n"
    )
    assert evaluate([str(run), "--quiet", "--json", str(disk.path / "all.json")]) == 2
    err = capsys.readouterr().err.splitlines()
    assert err[-1] == f"error: cannot write {disk.path / 'all.json'}: {NO_SPACE}" and "Traceback" not in err
    assert files_of(run) == before and leftovers(disk.path) == [] and not (disk.path / "all.json").exists()


# ------------------------------------------------------------------------- data, comparison, rows


def test_preparing_data_on_a_full_disk_is_one_line_and_keeps_the_old_set(disk, capsys):
    from gpt.commands.prepare_data import main as prepare

    out = disk.path / "tokens"
    args = ["shakespeare", "--out", str(out), "--max-tokens", "150000", "--val-tokens", "2000", "--test-tokens", "2000"]
    assert prepare([*args, "--quiet"]) == 0
    before = files_of(out)
    disk.fill()
    assert prepare([*args, "--quiet", "--overwrite", "--seed", "1"]) == 2
    assert capsys.readouterr().err == (
        f"error: cannot write the token set {out}: {NO_SPACE}; the set that was there is unchanged: free space "
        "(or lift the file-size limit), or write it elsewhere with --out\n"
    )
    assert files_of(out) == before and sorted(p.name for p in disk.path.iterdir()) == ["filler", "tokens"]


@pytest.mark.slow
def test_preparing_data_over_a_file_size_limit_is_one_line(tmp_path):
    out = tmp_path / "tokens"
    args = [ROOT / "scripts" / "prepare_data.py", "shakespeare", "--out", out, "--max-tokens", "200000"]
    args += ["--val-tokens", "2000", "--test-tokens", "2000", "--quiet"]
    one_line_error(
        run_cli(*args, preexec_fn=limit_file_size(100_000)),  # train.bin would be 392 KB
        f"cannot write the token set {out}: {FILE_TOO_LARGE}; nothing was kept",
    )
    assert list(tmp_path.iterdir()) == []


def test_a_comparison_on_a_full_disk_leaves_the_earlier_one_as_it_was(tmp_path, disk, capsys):
    from gpt.commands.compare import main as compare

    runs = [
        make_run(tmp_path, f"{n}-s{s}", n, s, 3.6 - s / 100) for n in ("pytorch_layernorm", "no_norm") for s in (0, 1)
    ]
    out = disk.path / "comparison"
    assert compare([*map(str, runs), "--out", str(out)]) == 0
    capsys.readouterr()
    before = files_of(out)
    disk.fill()
    assert compare([*map(str, runs), "--out", str(out), "--equivalence-margin", "0.02"]) == 2
    err = capsys.readouterr().err.splitlines()
    assert err[-1].startswith(f"error: cannot write {out}/") and err[-1].endswith(NO_SPACE), err
    assert files_of(out) == before and leftovers(out) == []


def test_benchmark_rows_on_a_full_disk_keep_the_rows_before(disk):
    from gpt.speed.rows import append_to

    rows = disk.path / "rows.jsonl"
    emit = append_to(rows)
    emit({"norm_type": "handrolled_layernorm", "ms_per_step": 1.5})
    emit({"norm_type": "pytorch_layernorm", "ms_per_step": 1.2})
    before = rows.read_bytes()
    disk.fill()
    with pytest.raises(WriteError, match=f"cannot write {rows}: {NO_SPACE}"):
        emit({"norm_type": "dyt", "ms_per_step": 2.0, "note": "x" * 10_000})
    assert rows.read_bytes() == before and leftovers(disk.path) == []


def test_publishing_from_a_full_disk_is_one_line(tiny_run_copy, disk, capsys, monkeypatch):
    from gpt.commands.push_to_hub import main as push

    run = tiny_run_copy("pub")
    disk.fill()
    monkeypatch.setattr(tempfile, "tempdir", str(disk.path))  # the export's temporary folder, on the full disk
    before = files_of(run)
    assert push([str(run), "--repo", "user/pub"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"error: cannot write {disk.path}/gpt-hub-") and NO_SPACE in err
    assert files_of(run) == before and not list(disk.path.glob("gpt-hub-*"))


def test_a_training_run_on_a_full_disk_keeps_its_last_checkpoint(train_yaml, tmp_path, disk, capsys):
    cfg = train_yaml("filling")
    text = cfg.read_text().replace(f"dir: {tmp_path / 'filling'}", f"dir: {disk.path / 'filling'}")
    cfg.write_text(text.replace("steps: 20", "steps: 40").replace("checkpoint_every: 10", "checkpoint_every: 10"))
    run = disk.path / "filling"
    rewound = {}

    from gpt.training import loop

    save = loop.save_checkpoint

    def fill_after_the_first(root, step, *args, **kwargs):  # the disk fills up after step 10's checkpoint
        path = save(root, step, *args, **kwargs)
        if step == 10:
            rewound.update(files_of(root / "step-00000010"))
            disk.fill()
        return path

    loop.save_checkpoint = fill_after_the_first
    try:
        summary = train(load_config(cfg))
    finally:
        loop.save_checkpoint = save
    assert summary["status"] == "interrupted"
    assert summary["stop_reason"].startswith(f"cannot write checkpoint step-00000020 in {run / 'checkpoints'}: ")
    assert NO_SPACE in summary["stop_reason"] and "the last good checkpoint is step-00000010" in summary["stop_reason"]
    assert files_of(run / "checkpoints" / "step-00000010") == rewound
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["best", "latest", "step-00000010"]
    assert json.loads((run / "summary.json").read_text())["status"] == "running"  # not writable: said, not torn
    assert "summary.json not written: No space left on device" in capsys.readouterr().err
    assert leftovers(run) == []


def test_the_run_folder_on_a_full_disk_at_the_start_is_one_line(train_yaml, disk, cli):
    cfg = train_yaml("nospace")
    cfg.write_text(cfg.read_text().replace(f"dir: {cfg.parent / 'nospace'}", f"dir: {disk.path / 'nospace'}"))
    disk.fill()
    one_line_error(cli("train", cfg), f"{disk.path / 'nospace'}", NO_SPACE)
    assert sorted(p.name for p in disk.path.iterdir()) == ["filler"]  # no run folder, no lock, no temporary file


def test_a_replaced_file_reaches_the_disk_before_its_name_does(tmp_path, monkeypatch):
    # a power cut after the rename must find the new name on whole data, never on blocks still in the page cache
    events = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd):
        events.append(("fsync", os.readlink(f"/proc/self/fd/{fd}")))
        return real_fsync(fd)

    def replace(src, dst):
        events.append(("replace", str(src), str(dst)))
        return real_replace(src, dst)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", replace)
    target = tmp_path / "result.json"
    with replacing(target) as tmp:
        tmp.write_text("{}")
    assert events == [("fsync", str(tmp)), ("replace", str(tmp), str(target)), ("fsync", str(tmp_path))]
    assert target.read_text() == "{}"
