"""A PEFT LoRA adapter_config.json: which HF modules it targets, and each one's rank and scaling,
matched the way peft matches them when it builds the adapter."""
import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path

CONFIG_FILE = "adapter_config.json"

# Config fields under which the adapter computes more than x @ A.T @ B.T * scaling on the base
# weights we serve (or needs base weights other than ours): refused when set.
UNSUPPORTED_FIELDS = {
    "use_dora": "DoRA", "lora_bias": "a bias on lora_B", "modules_to_save": "fully trained modules",
    "trainable_token_indices": "trained token embeddings", "layer_replication": "replicated layers",
    "target_parameters": "LoRA on raw parameters", "alora_invocation_tokens": "activated LoRA",
    "use_qalora": "QALoRA", "velora_config": "VeLoRA", "monteclora_config": "MonteCLoRA",
    "use_bdlora": "block-diagonal LoRA", "arrow_config": "Arrow routing", "kasa_config": "KaSA",
}
# init_lora_weights that rewrite the base weights around the adapter (unless peft converted the
# adapter at save time, which resets the field to true).
BASE_REWRITING_INITS = ("pissa", "olora", "corda", "loftq", "lora_ga")


class LoRALoadError(ValueError):
    """A LoRA adapter directory that cannot be served with this model; the message names why."""


@dataclass
class PeftLoRAConfig:
    r: int
    lora_alpha: float
    target_modules: list[str] | str
    exclude_modules: list[str] | str | None = None
    layers_to_transform: list[int] | None = None
    layers_pattern: list[str] = field(default_factory=list)
    rank_pattern: dict[str, int] = field(default_factory=dict)
    alpha_pattern: dict[str, float] = field(default_factory=dict)
    use_rslora: bool = False

    @classmethod
    def from_dir(cls, path: Path) -> "PeftLoRAConfig":
        if not path.is_dir():
            raise LoRALoadError("no such directory")
        file = path / CONFIG_FILE
        if not file.is_file():
            raise LoRALoadError(f"no {CONFIG_FILE} in the directory")
        try:
            raw = json.loads(file.read_text())
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise LoRALoadError(f"{CONFIG_FILE} is not valid JSON ({e})") from None
        if not isinstance(raw, dict):
            raise LoRALoadError(f"{CONFIG_FILE} is not a JSON object")
        try:
            return cls.from_dict(raw)
        except LoRALoadError as e:
            raise LoRALoadError(f"{CONFIG_FILE}: {e}") from None

    @classmethod
    def from_dict(cls, raw: dict) -> "PeftLoRAConfig":
        _check_supported(raw)
        layers = raw.get("layers_to_transform")
        pattern = raw.get("layers_pattern") or []
        config = cls(r=raw.get("r", 8), lora_alpha=raw.get("lora_alpha", 8),  # peft's defaults
                     target_modules=_names(raw, "target_modules"),
                     exclude_modules=_names(raw, "exclude_modules", required=False),
                     layers_to_transform=[layers] if isinstance(layers, int) else layers or None,
                     layers_pattern=[pattern] if isinstance(pattern, str) else pattern,
                     rank_pattern=raw.get("rank_pattern") or {}, alpha_pattern=raw.get("alpha_pattern") or {},
                     use_rslora=bool(raw.get("use_rslora", False)))
        config._check_types()
        config._check_regexes()
        return config

    def targets(self, name: str) -> bool:
        """Whether peft puts a LoRA on the HF module `name` (e.g. "model.layers.0.self_attn.q_proj")."""
        if self.exclude_modules and _matches(self.exclude_modules, name):
            return False
        if isinstance(self.target_modules, str):  # a regex: layers_to_transform does not apply
            return _matches(self.target_modules, name)
        return _matches(self.target_modules, name) and self._in_layers(name)

    def rank(self, name: str) -> int:
        return _pattern_value(self.rank_pattern, name, self.r)

    def scaling(self, name: str) -> float:
        alpha, r = _pattern_value(self.alpha_pattern, name, self.lora_alpha), self.rank(name)
        return alpha / math.sqrt(r) if self.use_rslora else alpha / r

    def _in_layers(self, name: str) -> bool:
        if self.layers_to_transform is None:
            return True
        # The first numbered segment (after a layers_pattern name, when given) is the layer index.
        regexes = ([rf"(?:^|.*?\.){p}\.(\d+)\." for p in self.layers_pattern] if self.layers_pattern
                   else [r".*?\.[^.]*\.(\d+)\."])
        for regex in regexes:
            if (match := re.match(regex, name)) is not None:
                return int(match.group(1)) in self.layers_to_transform
        return False

    def _check_types(self) -> None:
        if not _is_int(self.r) or self.r < 1:
            raise LoRALoadError(f"r must be a positive integer, got {self.r!r}")
        if not _is_number(self.lora_alpha):
            raise LoRALoadError(f"lora_alpha must be a number, got {self.lora_alpha!r}")
        layers, pattern = self.layers_to_transform, self.layers_pattern
        if layers is not None and not (isinstance(layers, list) and all(_is_int(i) for i in layers)):
            raise LoRALoadError(f"layers_to_transform must be an integer or a list of them, got {layers!r}")
        if not (isinstance(pattern, list) and all(isinstance(p, str) for p in pattern)):
            raise LoRALoadError(f"layers_pattern must be a string or a list of them, got {pattern!r}")
        for key, values, valid in (("rank_pattern", self.rank_pattern, lambda v: _is_int(v) and v >= 1),
                                   ("alpha_pattern", self.alpha_pattern, _is_number)):
            if not isinstance(values, dict) or not all(isinstance(k, str) and valid(v) for k, v in values.items()):
                raise LoRALoadError(f"{key} must map module patterns to "
                                    f"{'positive integers' if key == 'rank_pattern' else 'numbers'}, got {values!r}")

    def _check_regexes(self) -> None:
        regexes = [("layers_pattern", p) for p in self.layers_pattern]
        regexes += [(key, pattern) for key in ("target_modules", "exclude_modules")
                    if isinstance(pattern := getattr(self, key), str)]
        regexes += [(key, pattern) for key in ("rank_pattern", "alpha_pattern") for pattern in getattr(self, key)]
        for key, regex in regexes:
            try:
                re.compile(regex)
            except re.error as e:
                raise LoRALoadError(f"{key} {regex!r} is not a valid regex ({e})") from None


def _check_supported(raw: dict) -> None:
    if raw.get("peft_type") != "LORA":
        raise LoRALoadError(f"peft_type is {raw.get('peft_type')!r}: only LoRA adapters (\"LORA\") are served")
    for key, what in UNSUPPORTED_FIELDS.items():
        if raw.get(key):
            raise LoRALoadError(f"{key}={raw[key]!r}: {what} is not supported, only plain LoRA")
    if raw.get("bias", "none") != "none":
        raise LoRALoadError(f"bias={raw['bias']!r}: trained biases are not supported, only bias=\"none\"")
    init = raw.get("init_lora_weights")
    if isinstance(init, str) and init.lower().startswith(BASE_REWRITING_INITS):
        raise LoRALoadError(f"init_lora_weights={init!r} rewrites the base weights, which are served "
                            "unchanged; save the adapter with peft's path_initial_model_for_weight_conversion")
    # fan_in_fan_out needs no check: it transposes only a Conv1D base weight at merge time, while
    # lora_A and lora_B are [r, in] and [out, r] either way (peft itself clears it for nn.Linear).


def _names(raw: dict, key: str, required: bool = True) -> list[str] | str | None:
    value = raw.get(key)
    if value is None and not required:
        return None
    if isinstance(value, str):
        if value.lower() == "all-linear":  # peft's shorthand: every linear layer but the LM head
            return r".*\.(q|k|v|o|gate|up|down)_proj"
        return value
    if isinstance(value, list) and value and all(isinstance(v, str) for v in value):
        return value
    raise LoRALoadError(f"{key} must be a regex string or a non-empty list of module names, got {value!r}")


def _matches(spec: list[str] | str, name: str) -> bool:
    if isinstance(spec, str):
        return re.fullmatch(spec, name) is not None
    return any(name == s or name.endswith(f".{s}") for s in spec)


def _pattern_value(pattern: dict, name: str, default):
    """peft's rank_pattern / alpha_pattern lookup: the first key that matches a suffix of name."""
    for key, value in pattern.items():
        if re.match(rf"(.*\.)?({key})$", name) is not None:
            return value
    return default


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)
