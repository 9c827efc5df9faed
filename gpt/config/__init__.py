"""Typed run configuration: the schema (``schema``) and reading it from YAML (``loader``).

    from gpt.config import load_config
    cfg = load_config("configs/tiny.yaml", ["model.norm_type=pytorch_rmsnorm"])

Owns: every config key with its default and doc, the names a config may choose among (norm types,
norm placements, schedules, precisions), overrides, the differences that refuse a resume.
May import: ``gpt.common``; never torch (a config is checked before anything heavy loads).
"""

from gpt.config.loader import (
    ConfigError,
    config_differences,
    config_from_dict,
    config_to_dict,
    describe_fields,
    dump_config,
    flatten,
    load_config,
    parse_override,
    parse_yaml,
)
from gpt.config.schema import (
    DEFAULT_BASELINE,
    NORM_PLACEMENTS,
    NORM_TYPES,
    PRECISIONS,
    QK_NORMS,
    RESUMABLE,
    SCHEDULES,
    Config,
    DataConfig,
    HubConfig,
    LogConfig,
    ModelConfig,
    OptimConfig,
    RunConfig,
    TrainConfig,
    norm_label_arg,
    norm_order,
)

__all__ = [
    "DEFAULT_BASELINE",
    "NORM_PLACEMENTS",
    "NORM_TYPES",
    "PRECISIONS",
    "QK_NORMS",
    "SCHEDULES",
    "Config",
    "ConfigError",
    "DataConfig",
    "HubConfig",
    "LogConfig",
    "ModelConfig",
    "OptimConfig",
    "RESUMABLE",
    "RunConfig",
    "TrainConfig",
    "config_differences",
    "norm_label_arg",
    "norm_order",
    "config_from_dict",
    "config_to_dict",
    "describe_fields",
    "dump_config",
    "flatten",
    "load_config",
    "parse_override",
    "parse_yaml",
]
