"""`--lora-modules`: adapters the server loads at startup, as vLLM writes them: `name=path`, or a
JSON object `{"name": ..., "path": ..., "base_model_name": ...}`."""
import argparse
import json
import os
from dataclasses import dataclass

# vLLM's switch for the load/unload routes, read where --allow-runtime-lora is not given.
RUNTIME_LORA_ENV = "VLLM_ALLOW_RUNTIME_LORA_UPDATING"


@dataclass(frozen=True)
class LoRAModulePath:
    name: str
    path: str
    base_model_name: str | None = None


def parse_lora_module(text: str) -> LoRAModulePath:
    """One `--lora-modules` value; argparse reports an ArgumentTypeError as a usage error."""
    if text.lstrip().startswith("{"):
        return _from_json(text)
    name, sep, path = text.partition("=")
    if not sep or not name.strip() or not path.strip():
        raise argparse.ArgumentTypeError(f"{text!r} is neither name=path nor a JSON object "
                                         '{"name": ..., "path": ..., "base_model_name": ...}')
    return LoRAModulePath(name.strip(), path.strip())


def _from_json(text: str) -> LoRAModulePath:
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise argparse.ArgumentTypeError(f"{text!r} is not valid JSON: {e}") from None
    if not isinstance(data, dict):
        raise argparse.ArgumentTypeError(f"{text!r} must be a JSON object")
    unknown = set(data) - {"name", "path", "base_model_name"}
    if unknown:
        raise argparse.ArgumentTypeError(f"{text!r}: unknown field(s) {sorted(unknown)}; the fields are "
                                         "name, path and base_model_name")
    for key in ("name", "path"):
        if not isinstance(data.get(key), str) or not data[key]:
            raise argparse.ArgumentTypeError(f"{text!r}: {key!r} must be a non-empty string")
    base = data.get("base_model_name")
    if base is not None and not isinstance(base, str):
        raise argparse.ArgumentTypeError(f"{text!r}: 'base_model_name' must be a string")
    return LoRAModulePath(data["name"], data["path"], base)


def runtime_lora_from_env() -> bool:
    """VLLM_ALLOW_RUNTIME_LORA_UPDATING as vLLM reads it: 1 / true on, unset / 0 / false off."""
    value = os.environ.get(RUNTIME_LORA_ENV, "").strip().lower()
    if value in ("1", "true"):
        return True
    if value in ("", "0", "false"):
        return False
    raise ValueError(f"{RUNTIME_LORA_ENV} must be 1, true, 0 or false, got {value!r}")
