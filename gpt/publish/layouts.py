"""The two ways a checkpoint is laid out on the Hub, and reading either one back.

- ``Layout.REMOTE_CODE`` (every norm type): the harness's parameter names under the prefix
  ``gpt.``, the thin transformers wrapper from ``hub_code/`` (``modeling_gpt_norm.py``,
  ``configuration_gpt_norm.py``) and verbatim copies of the model's own files
  (``gpt/model/gpt.py``, ``norms.py``, ``loss.py``) and of the architecture spec (``gpt/config/architecture.py``:
  how config.json's keys read): the published network is the trained one.
  Loads with ``AutoModelForCausalLM.from_pretrained(repo, trust_remote_code=True)``.
- ``Layout.NATIVE_GPT2`` (pre-norm LayerNorm models without QK-norm only): the stock ``GPT2LMHeadModel``
  layout, no code.

Exports read tensors straight from the checkpoint's safetensors (no model is built), so an
upload during training costs the training thread nothing.
"""

from __future__ import annotations

import enum
from pathlib import Path
from types import SimpleNamespace

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file

from gpt.common.errors import first_line
from gpt.common.files import copy_atomically, read_json
from gpt.config import Config, config_from_dict, config_to_dict
from gpt.config.architecture import gpt2_mismatch, to_hub
from gpt.data.tokenizer import EOT_TOKEN
from gpt.model.gpt import GPT, VOCAB_ROWS
from gpt.model.gpt2_weights import (
    hf_config_kwargs,
    model_config_from_hf,
    state_dict_from_hf,
    state_dict_to_hf,
)
from gpt.publish.hub_api import HubError
from gpt.run.checkpoints import MODEL_FILE


class Layout(enum.Enum):
    """How an export lays a checkpoint out (see the module's docstring)."""

    REMOTE_CODE = "remote_code"
    NATIVE_GPT2 = "native_gpt2"


HUB_CODE = Path(__file__).parent / "hub_code"  # the transformers wrapper: config and model classes
WRAPPER_FILES = ("configuration_gpt_norm.py", "modeling_gpt_norm.py")
PACKAGE = Path(__file__).parents[1]
# shipped verbatim, by their name on the Hub: the wrapper imports the model itself, and reads config.json by the spec
SHIPPED = {
    "gpt.py": PACKAGE / "model" / "gpt.py",
    "norms.py": PACKAGE / "model" / "norms.py",
    "loss.py": PACKAGE / "model" / "loss.py",
    "architecture.py": PACKAGE / "config" / "architecture.py",
}
REMOTE_PREFIX = "gpt."  # the wrapper holds the harness's GPT as ``self.gpt``


def read_weights(ckpt: Path) -> dict[str, torch.Tensor]:
    try:
        return load_file(str(ckpt / MODEL_FILE))
    except (SafetensorError, OSError) as e:
        raise HubError(f"{ckpt / MODEL_FILE}: cannot read ({first_line(e)})") from None


def export_weights(cfg: Config, sd: dict[str, torch.Tensor], layout: Layout) -> dict[str, torch.Tensor]:
    """The tensors to publish in ``layout``: vocabulary padding dropped, a tied head left to the loader."""
    m = cfg.model
    if m.tie_weights:  # a checkpoint keeps one name of a shared tensor (safetensors' save_model)
        shared = sd["wte.weight"] if "wte.weight" in sd else sd["lm_head.weight"]
        sd = {**sd, "wte.weight": shared, "lm_head.weight": shared}
    if layout is Layout.NATIVE_GPT2:
        mismatch = gpt2_mismatch(m)
        if mismatch is not None:
            raise HubError(f"--native-gpt2: {mismatch}; publish it with remote code (without --native-gpt2)")
        out = state_dict_to_hf(sd, m)
    else:
        out = {k: v[: m.vocab_size] if k in VOCAB_ROWS else v for k, v in sd.items()}
    if m.tie_weights:
        out.pop("lm_head.weight")  # the embedding itself (both layouts name it so): tied again on load
    prefix = REMOTE_PREFIX if layout is Layout.REMOTE_CODE else ""
    return {prefix + k: v.contiguous() for k, v in out.items()}


def special_tokens(vocab_size: int) -> dict:
    """<|endoftext|> begins and ends generation, and pads a batch (left, never read), in a vocabulary that has it."""
    eot = EOT_TOKEN if vocab_size > EOT_TOKEN else None
    return {"bos_token_id": eot, "eos_token_id": eot, "pad_token_id": eot}


def remote_config(cfg: Config) -> dict:
    """config.json of the remote-code layout; ``harness_config`` is the run's whole config."""
    m = cfg.model
    return {
        "architectures": ["GPTNormForCausalLM"],
        "model_type": "gpt_norm",
        "auto_map": {
            "AutoConfig": "configuration_gpt_norm.GPTNormConfig",
            "AutoModelForCausalLM": "modeling_gpt_norm.GPTNormForCausalLM",
        },
        **to_hub(m),  # every exported option, under its config.json key (gpt.config.architecture)
        **special_tokens(m.vocab_size),
        "use_cache": True,
        "dtype": "float32",
        "harness_config": config_to_dict(cfg),
    }


def hub_config(cfg: Config, layout: Layout) -> dict:
    """config.json in ``layout``."""
    return native_config(cfg) if layout is Layout.NATIVE_GPT2 else remote_config(cfg)


def native_config(cfg: Config) -> dict:
    """config.json of the stock GPT2LMHeadModel layout."""
    return {
        "architectures": ["GPT2LMHeadModel"],
        "model_type": "gpt2",
        **hf_config_kwargs(cfg.model),
        "n_ctx": cfg.model.context_length,
        **special_tokens(cfg.model.vocab_size),
        "dtype": "float32",
        "harness_config": config_to_dict(cfg),
    }


def write_code(folder: Path) -> list[str]:
    """The remote-code layout's Python files: the wrapper, and the model's own files as they are."""
    for name in WRAPPER_FILES:
        copy_atomically(HUB_CODE / name, folder / name)
    for name, source in SHIPPED.items():
        copy_atomically(source, folder / name)
    return [*WRAPPER_FILES, *SHIPPED]


def load_published(folder: Path):
    """Our GPT from an export folder (either layout), e.g. a Hub repo's snapshot."""
    config = read_json(folder / "config.json", "model config", fix="not a published model", error=HubError)
    weights = read_weights(folder)
    if config.get("model_type") == "gpt2":  # the stock layout (Q/K/V bias present, zero where we had none)
        cfg = model_config_from_hf(SimpleNamespace(**config))
        weights = state_dict_from_hf(weights, cfg)
    elif "harness_config" in config:
        cfg = config_from_dict(config["harness_config"], str(folder / "config.json")).model
        cfg.vocab_pad_multiple = 1  # the export left the padding behind
        weights = {k.removeprefix(REMOTE_PREFIX): v for k, v in weights.items()}
        if cfg.tie_weights:
            weights["lm_head.weight"] = weights["wte.weight"]
    else:
        raise HubError(
            f"{folder / 'config.json'}: neither this harness's model nor GPT-2 "
            f"(model_type {config.get('model_type')!r})"
        )
    model = GPT(cfg)
    model.load_state_dict(weights)
    return model.eval()
