"""Config files and command-line overrides: reading a YAML/JSON config file (a Tune
experiment file included) and parsing ``--set KEY=VALUE``.
"""

from __future__ import annotations

import json
import os
from typing import Any

from actorrl.config.sections import ConfigError


def parse_override(text: str) -> tuple[str, Any]:
    """``"key=value"`` -> (key, value) with the value parsed as JSON when it is valid JSON
    (numbers, true/false, null, lists, objects) and kept as a string otherwise."""
    key, sep, raw = text.partition("=")
    if not sep or not key.strip():
        raise ConfigError(f"override {text!r} must look like key=value")
    try:
        value = json.loads(raw)
    except json.JSONDecodeError:
        lowered = raw.strip().lower()
        value = {"true": True, "false": False, "none": None}.get(lowered, raw)
    return key.strip(), value


def read_config_file(path: str) -> dict[str, Any]:
    """Read a YAML (``.yaml``/``.yml``) or JSON config file into a dict."""
    if not os.path.exists(path):
        raise ConfigError(f"config file {path!r} does not exist")
    with open(path) as f:
        text = f.read()
    if path.endswith((".yaml", ".yml")):
        import yaml

        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            raise ConfigError(f"config file {path!r} is not valid YAML: {exc}") from None
    else:
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ConfigError(f"config file {path!r} is not valid JSON: {exc}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"config file {path!r} must hold a mapping of keys to values")
    return data
