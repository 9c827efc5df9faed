"""Typed run configuration: the schema (``schema``) and reading it from YAML (``loader``).

    from gpt.config import load_config
    cfg = load_config("configs/tiny.yaml", ["model.norm_type=pytorch_rmsnorm"])
"""

from gpt.config.loader import (ConfigError, config_differences, config_from_dict, config_to_dict, describe_fields,
                               dump_config, flatten, load_config, parse_override)
from gpt.config.schema import (RESUMABLE, Config, DataConfig, HubConfig, LogConfig, ModelConfig, OptimConfig,
                               RunConfig, TrainConfig)

__all__ = ["Config", "ConfigError", "DataConfig", "HubConfig", "LogConfig", "ModelConfig", "OptimConfig",
           "RESUMABLE", "RunConfig", "TrainConfig", "config_differences", "config_from_dict", "config_to_dict",
           "describe_fields", "dump_config", "flatten", "load_config", "parse_override"]
