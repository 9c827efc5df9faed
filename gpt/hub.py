"""Publishing checkpoints on the Hugging Face Hub, in a layout ``transformers`` loads.

An export folder holds ``model.safetensors``, a ``config.json``, the GPT-2 tokenizer files
(``vocab.json``, ``merges.txt``, from the same offline BPE files as ``gpt.tokenizer``),
the model card ``README.md`` and the loss curve. Two layouts:

- remote code (every norm type): our parameter names, ``modeling_gpt_norm.py`` and
  ``configuration_gpt_norm.py`` from ``gpt/hub_code/`` and a verbatim copy of
  ``gpt/norms.py``; ``AutoModelForCausalLM.from_pretrained(repo, trust_remote_code=True)``.
- ``native_gpt2`` (LayerNorm models only): the stock ``GPT2LMHeadModel`` layout, no code.

Exports read tensors straight from the checkpoint's safetensors (no model is built), so an
upload during training costs the training thread nothing. Uploads go through
``huggingface_hub`` with the token from the environment (``HF_TOKEN``) or the Hub's own
login; it is passed to nothing and written nowhere.
"""

from __future__ import annotations

import json
import queue
import shutil
import tempfile
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from gpt.card import CardFacts, card_text
from gpt.checkpoint import CONFIG_FILE, INFO_FILE, MODEL_FILE, checkpoint_config, read_info
from gpt.config import Config, config_from_dict, config_to_dict
from gpt.data import read_meta
from gpt.errors import UserError, first_line, os_reason, shortened
from gpt.hf import HF_COMPATIBLE_NORMS, hf_config_kwargs, model_config_from_hf, state_dict_from_hf, state_dict_to_hf
from gpt.model import GPT, VOCAB_ROWS
from gpt.rundir import RunDir, read_eval_result
from gpt.tokenizer import EOT_TOKEN, gpt2_files_dir

HUB_CODE = Path(__file__).parent / "hub_code"
NORMS_SOURCE = Path(__file__).parent / "norms.py"  # shipped verbatim as norms.py beside the modelling code
CODE_FILES = ("configuration_gpt_norm.py", "modeling_gpt_norm.py")
EOT = "<|endoftext|>"


class HubError(UserError):
    """An export or upload that cannot be done."""


class UploadError(HubError):
    """An upload that failed after its retries; ``reason`` says why and what to do, without the repo."""

    def __init__(self, message: str, reason: str):
        super().__init__(message)
        self.reason = reason


# ------------------------------------------------------------------ the export folder

def read_weights(ckpt: Path) -> dict[str, torch.Tensor]:
    try:
        return load_file(str(ckpt / MODEL_FILE))
    except (SafetensorError, OSError) as e:
        raise HubError(f"{ckpt / MODEL_FILE}: cannot read ({first_line(e)})") from None


def export_weights(cfg: Config, sd: dict[str, torch.Tensor], native_gpt2: bool) -> dict[str, torch.Tensor]:
    """The tensors to publish: vocabulary padding dropped, a tied head left to the loader."""
    m = cfg.model
    if m.tie_weights:  # a checkpoint keeps one name of a shared tensor (safetensors' save_model)
        shared = sd["wte.weight"] if "wte.weight" in sd else sd["lm_head.weight"]
        sd = {**sd, "wte.weight": shared, "lm_head.weight": shared}
    if native_gpt2:
        if m.norm_type not in HF_COMPATIBLE_NORMS:
            raise HubError(f"--native-gpt2: GPT2LMHeadModel has LayerNorm only, and this model's norm is "
                           f"{m.norm_type}; publish it with remote code (without --native-gpt2); native: "
                           f"{', '.join(HF_COMPATIBLE_NORMS)}")
        out = state_dict_to_hf(sd, m)
    else:
        out = {k: v[:m.vocab_size] if k in VOCAB_ROWS else v for k, v in sd.items()}
    if m.tie_weights:
        out.pop("lm_head.weight")  # the embedding itself (both layouts name it so): tied again on load
    return {k: v.contiguous() for k, v in out.items()}


def special_tokens(vocab_size: int) -> dict:
    """<|endoftext|> begins and ends generation, in a vocabulary that has it."""
    eot = EOT_TOKEN if vocab_size > EOT_TOKEN else None
    return {"bos_token_id": eot, "eos_token_id": eot}


def remote_config(cfg: Config) -> dict:
    """config.json of the remote-code layout; ``harness_config`` is the run's whole config."""
    m = cfg.model
    return {"architectures": ["GPTNormForCausalLM"], "model_type": "gpt_norm",
            "auto_map": {"AutoConfig": "configuration_gpt_norm.GPTNormConfig",
                         "AutoModelForCausalLM": "modeling_gpt_norm.GPTNormForCausalLM"},
            "vocab_size": m.vocab_size, "n_positions": m.context_length, "n_embd": m.d_model, "n_layer": m.n_layers,
            "n_head": m.n_heads, "norm_type": m.norm_type, "norm_eps": m.norm_eps,
            "dyt_alpha_init": m.dyt_alpha_init, "qkv_bias": m.qkv_bias, "tie_word_embeddings": m.tie_weights,
            **special_tokens(m.vocab_size), "use_cache": False, "dtype": "float32",
            "harness_config": config_to_dict(cfg)}


def native_config(cfg: Config) -> dict:
    """config.json of the stock GPT2LMHeadModel layout."""
    return {"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2", **hf_config_kwargs(cfg.model),
            "n_ctx": cfg.model.context_length, **special_tokens(cfg.model.vocab_size), "dtype": "float32",
            "harness_config": config_to_dict(cfg)}


def write_tokenizer(folder: Path, context_length: int) -> list[str]:
    """GPT-2's tokenizer files, from the offline BPE files (encoder.json -> vocab.json, vocab.bpe -> merges.txt)."""
    src = gpt2_files_dir()
    shutil.copyfile(src / "encoder.json", folder / "vocab.json")
    shutil.copyfile(src / "vocab.bpe", folder / "merges.txt")
    (folder / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "GPT2Tokenizer", "model_max_length": context_length, "add_prefix_space": False,
        "bos_token": EOT, "eos_token": EOT, "unk_token": EOT}, indent=2) + "\n")
    (folder / "special_tokens_map.json").write_text(json.dumps({"bos_token": EOT, "eos_token": EOT,
                                                                "unk_token": EOT}, indent=2) + "\n")
    return ["vocab.json", "merges.txt", "tokenizer_config.json", "special_tokens_map.json"]


def card_facts(ckpt: Path, cfg: Config, repo_id: str, n_params: int, run: RunDir, summary: dict | None,
               comparison: dict | None, native_gpt2: bool) -> CardFacts:
    """What the card says of ``ckpt``: its info, the run's summary and charts, its test loss."""
    info = read_info(ckpt)
    evaluation = next((e for p in ("fp32", "bf16", "fp16") if (e := read_eval_result(ckpt, "test", p))), None)
    meta = read_meta(cfg.data.path) if cfg.data.path and Path(cfg.data.path, "meta.json").is_file() else None
    source = (meta or {}).get("source")  # prepare_data's description: a Hub data set's repo, or a name
    if isinstance(source, dict):
        source = source.get("repo") or source.get("name")
    return CardFacts(repo_id=repo_id, n_params=n_params, step=info.get("step"), tokens=info.get("tokens"),
                     val_loss=info.get("val_loss"), summary=summary if summary is not None else run.summary(),
                     evaluation=evaluation, comparison=comparison if comparison is not None else find_comparison(run),
                     data_source=source if isinstance(source, str) else None, native_gpt2=native_gpt2,
                     loss_png=(run.path / "loss.png").is_file())


def comparison_row(result: dict, run: RunDir) -> dict | None:
    """The group of a comparison result (comparison.json) that holds ``run``, with the baseline's name."""
    for group in result.get("groups", []):
        if any(Path(r.get("path", "")).resolve() == run.path.resolve() for r in group.get("runs", [])):
            return {**group, "baseline": result.get("baseline")}
    return None


def find_comparison(run: RunDir) -> dict | None:
    """The run's group in a comparison.json beside it (what scripts/sweep.py writes), if any."""
    for path in sorted(run.path.parent.glob("*/comparison.json")):
        try:
            row = comparison_row(json.loads(path.read_text()), run)
        except (OSError, ValueError):
            continue
        if row is not None:
            return row
    return None


def export_checkpoint(ckpt: Path, folder: Path, repo_id: str, *, native_gpt2: bool = False,
                      run: RunDir | None = None, summary: dict | None = None,
                      comparison: dict | None = None) -> list[str]:
    """Write ``ckpt`` into ``folder`` as a Hub repo's files; returns their names."""
    cfg = checkpoint_config(ckpt)
    weights = export_weights(cfg, read_weights(ckpt), native_gpt2)
    folder.mkdir(parents=True, exist_ok=True)
    save_file(weights, str(folder / MODEL_FILE), metadata={"format": "pt"})
    config = native_config(cfg) if native_gpt2 else remote_config(cfg)
    (folder / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    files = [MODEL_FILE, "config.json", *write_tokenizer(folder, cfg.model.context_length)]
    if not native_gpt2:
        for name in CODE_FILES:
            shutil.copyfile(HUB_CODE / name, folder / name)
        shutil.copyfile(NORMS_SOURCE, folder / "norms.py")
        files += [*CODE_FILES, "norms.py"]
    n_params = sum(v.numel() for v in weights.values())  # as published: a tied head once, no padding
    run = run or RunDir.of_checkpoint(ckpt)
    facts = card_facts(ckpt, cfg, repo_id, n_params, run, summary, comparison, native_gpt2)
    if facts.loss_png:
        shutil.copyfile(run.path / "loss.png", folder / "loss.png")
        files.append("loss.png")
    (folder / "README.md").write_text(card_text(cfg, facts))
    return [*files, "README.md"]


def load_published(folder: Path):
    """Our GPT from an export folder (either layout), e.g. a Hub repo's snapshot."""
    try:
        config = json.loads((folder / "config.json").read_text())
    except (OSError, ValueError) as e:
        raise HubError(f"{folder / 'config.json'}: cannot read ({first_line(e)}); not a published model") from None
    weights = read_weights(folder)
    if config.get("model_type") == "gpt2":  # the stock layout (Q/K/V bias present, zero where we had none)
        cfg = model_config_from_hf(SimpleNamespace(**config))
        weights = state_dict_from_hf(weights, cfg)
    elif "harness_config" in config:
        cfg = config_from_dict(config["harness_config"], str(folder / "config.json")).model
        cfg.vocab_pad_multiple = 1  # the export left the padding behind
        if cfg.tie_weights:
            weights["lm_head.weight"] = weights["wte.weight"]
    else:
        raise HubError(f"{folder / 'config.json'}: neither this harness's model nor GPT-2 "
                       f"(model_type {config.get('model_type')!r})")
    model = GPT(cfg)
    model.load_state_dict(weights)
    return model.eval()


# ------------------------------------------------------------------ the upload

# Every request to the Hub gives up after these (connect, read, write, pool) seconds: the client's own default
# is to wait forever, and a Hub that accepts connections and never answers would hold a run's end for good.
HUB_TIMEOUT_S = (10.0, 60.0, 60.0, 10.0)


def bounded_session():
    """huggingface_hub's shared HTTP client, with ``HUB_TIMEOUT_S`` on every request it makes."""
    from huggingface_hub import get_session

    session = get_session()
    if hasattr(session, "timeout"):  # httpx (huggingface_hub >= 1.0); requests' sessions take no default
        session.timeout = HUB_TIMEOUT_S
    return session


def endpoint() -> str:
    from huggingface_hub import constants

    return constants.ENDPOINT


def why_upload_failed(error: BaseException) -> str:
    """The fix a failed upload calls for: the network and the endpoint when the Hub did not answer or could
    not be reached, the token when it refused."""
    status = getattr(getattr(error, "response", None), "status_code", None)
    if status in (401, 403):
        return "check the token (HF_TOKEN or `hf auth login`) and its write access"
    network = ("Timeout", "ConnectError", "ConnectionError", "NetworkError", "RemoteProtocolError", "ReadError")
    if any(name in type(e).__name__ for e in (error, error.__cause__, error.__context__) if e is not None
           for name in network):
        return f"the Hub at {endpoint()} did not answer; check the network, or HF_ENDPOINT"
    return "check the repository name and the token's write access (HF_TOKEN or `hf auth login`)"


def upload_folder(folder: Path, repo_id: str, *, private: bool = True, revision: str | None = None,
                  message: str = "Upload model", attempts: int = 3, backoff: float = 1.0) -> str:
    """Create the repo (and branch) if needed and upload ``folder`` in one commit; returns the commit id.
    Errors are retried ``attempts`` times with doubling waits, then raised as one HubError line."""
    from huggingface_hub import HfApi  # imported when used: training without a hub repo never needs it

    bounded_session()
    api = HfApi()
    error = None
    for attempt in range(attempts):
        try:
            api.create_repo(repo_id, private=private, exist_ok=True)
            if revision not in (None, "main"):
                api.create_branch(repo_id, branch=revision, exist_ok=True)
            info = api.upload_folder(repo_id=repo_id, folder_path=str(folder), revision=revision,
                                     commit_message=message)
            return info.oid
        except Exception as e:  # noqa: BLE001  any failure of the client or the network: retried, then one line
            error = e
            if attempt + 1 < attempts:
                time.sleep(backoff * 2 ** attempt)
    reason = f"{first_line(error)}; {why_upload_failed(error)}"
    raise UploadError(f"upload to {repo_id}{'@' + revision if revision else ''} failed after {attempts} attempts: "
                      f"{first_line(error)}; nothing local changed: {why_upload_failed(error)}, then run again", reason)


def push(ckpt: Path, repo_id: str, *, native_gpt2: bool = False, private: bool = True, revision: str | None = None,
         comparison: dict | None = None) -> tuple[str, list[str]]:
    """Export ``ckpt`` to a temporary folder and upload it; returns (commit id, files)."""
    with tempfile.TemporaryDirectory(prefix="gpt-hub-") as tmp:
        files = export_checkpoint(ckpt, Path(tmp), repo_id, native_gpt2=native_gpt2, comparison=comparison)
        info = read_info(ckpt)
        commit = upload_folder(Path(tmp), repo_id, private=private, revision=revision,
                               message=f"{ckpt.name} (step {info.get('step', '?')})")
    return commit, files


# ------------------------------------------------------------------ upload during training

def stage(ckpt: Path, staged: Path) -> None:
    """Hard-link (or copy) what an export reads of ``ckpt`` into ``staged``."""
    shutil.rmtree(staged, ignore_errors=True)
    staged.mkdir(parents=True)
    for name in (MODEL_FILE, CONFIG_FILE, INFO_FILE):
        try:
            (staged / name).hardlink_to(ckpt / name)
        except OSError:  # another file system, or no hard links: a copy
            shutil.copyfile(ckpt / name, staged / name)
    for e in ckpt.glob("eval-*.json"):
        shutil.copyfile(e, staged / e.name)


class CheckpointUploader:
    """Uploads a run's checkpoints from one background thread, so training never waits for the Hub.

    Each checkpoint goes to the branch named after it (``step-00001000``), the final model to
    ``main`` with its card. Submitting hard-links the checkpoint's files into the run's staging
    folder (so pruning cannot take them away) and returns at once; a staged copy is removed
    once its upload succeeds or fails, so the staging folder is the queue, on disk. A run that
    stopped with uploads left (or was killed) leaves their staged copies: the next start
    queues them again, before anything new, and removes whatever is incomplete. What was
    uploaded is kept in the run's ``hub.json``: no checkpoint is uploaded twice.
    """

    def __init__(self, run: RunDir, repo_id: str, private: bool, attempts: int = 3, backoff: float = 1.0):
        self.run, self.repo_id, self.private = run, repo_id, private
        self.attempts, self.backoff = attempts, backoff
        self.lock = threading.Lock()  # the record is written by the worker and, at the end, by the trainer
        self.record = run.hub_record()  # {"repo_id", "uploaded": {branch: commit}, "failed": {branch: reason}}
        self.record["repo_id"] = repo_id
        self.jobs: queue.Queue = queue.Queue()
        self.current: tuple[Path, str] | None = None  # the upload under way
        self.requeued = self._requeue_staged()
        self.thread = threading.Thread(target=self._work, name="hub-upload", daemon=True)
        self.thread.start()

    def _requeue_staged(self) -> list[str]:
        """Queue the staged copies an earlier process left (oldest step first); remove incomplete ones."""
        staging, branches = self.run.hub_staging, []
        for staged in sorted(staging.iterdir()) if staging.is_dir() else []:
            branch = staged.name[len("step-00000000-"):]
            complete = all((staged / name).is_file() for name in (MODEL_FILE, CONFIG_FILE, INFO_FILE))
            if complete and branch and (branch == "main" or branch not in self.record["uploaded"]):
                self.jobs.put((staged, branch, None))
                branches.append(branch)
            else:
                shutil.rmtree(staged, ignore_errors=True)
        return branches

    def submit(self, ckpt: Path, branch: str | None = None, summary: dict | None = None) -> bool:
        """Queue ``ckpt`` for upload to ``branch`` (default: its own name); False if it is already there."""
        branch = branch or ckpt.name
        if branch != "main" and branch in self.record["uploaded"]:
            return False
        staged = self.run.hub_staging / f"{ckpt.name}-{branch}"
        try:
            stage(ckpt, staged)
        except OSError as e:  # a full disk, say: this checkpoint is not uploaded, training goes on
            self._note(branch, failed=f"not staged for upload: {os_reason(e)}")
            shutil.rmtree(staged, ignore_errors=True)
            return False
        self.jobs.put((staged, branch, summary))
        return True

    def _work(self) -> None:
        while (job := self.jobs.get()) is not None:
            staged, branch, summary = job
            self.current = (staged, branch)
            try:
                with tempfile.TemporaryDirectory(prefix="gpt-hub-") as tmp:
                    export_checkpoint(staged, Path(tmp), self.repo_id, run=self.run, summary=summary)
                    commit = upload_folder(Path(tmp), self.repo_id, private=self.private, revision=branch,
                                           message=f"{staged.name} ({branch})", attempts=self.attempts,
                                           backoff=self.backoff)
                self._note(branch, uploaded=commit)
            except Exception as e:  # noqa: BLE001  a failed upload is recorded, never raised into training
                self._note(branch, failed=getattr(e, "reason", None) or first_line(e))
            finally:
                shutil.rmtree(staged, ignore_errors=True)
                self.current = None

    def _note(self, branch: str, uploaded: str | None = None, failed: str | None = None) -> None:
        with self.lock:
            if uploaded is not None:
                self.record["uploaded"][branch] = uploaded
                self.record["failed"].pop(branch, None)
            else:
                self.record["failed"][branch] = failed
            self.run.write_hub_record(self.record)

    def left(self) -> list[str]:
        """The branches still to upload: the one under way, then the queue."""
        current = [self.current[1]] if self.current is not None else []
        return current + [job[1] for job in list(self.jobs.queue) if job is not None]

    def finish(self, final: Path | None = None, summary: dict | None = None, stop=None,
               wait_s: float = 60.0) -> dict:
        """Upload ``final`` to main (when given) and wait for the queued uploads: for all of them, unless a
        stop signal came (``stop.requested``), then for at most ``wait_s`` seconds from it, or a second one
        (``stop.hurry``), then not at all. What is left stays staged for the next start; the report says it."""
        if final is not None:
            self.submit(final, "main", summary)
        self.jobs.put(None)
        deadline = None
        while self.thread.is_alive():
            if stop is not None and stop.hurry:
                break
            if stop is not None and stop.requested:
                deadline = deadline or time.monotonic() + wait_s
                if time.monotonic() >= deadline:
                    break
            self.thread.join(0.2)
        with self.lock:
            left = self.left() if self.thread.is_alive() else []
            self.record["left"] = left
            self.run.write_hub_record(self.record)
            if not left:
                shutil.rmtree(self.run.hub_staging, ignore_errors=True)
            return {"repo_id": self.repo_id, "endpoint": endpoint(), "uploaded": sorted(self.record["uploaded"]),
                    "failed": dict(self.record["failed"]), "left": left}


def upload_problems(report: dict) -> str | None:
    """The uploads of a run's end in one line: how many failed and why (each reason once, with its count),
    how many are left for the next start; None when all went up."""
    failed, left = report["failed"], report["left"]
    if not failed and not left:
        return None
    reasons: dict[str, list[str]] = {}
    for branch, why in failed.items():
        reasons.setdefault(why, []).append(branch)
    parts = [f"{len(branches)} failed ({shortened(branches)}): {why}" for why, branches in reasons.items()]
    if left:
        parts.append(f"{len(left)} left for the next start ({shortened(left)})")
    return f"Hub uploads to {report['repo_id']} at {report['endpoint']}: " + "; ".join(parts)
