"""The names a request's `model` may take: the base model's and each LoRA adapter's. Adapters come
from --lora-modules at startup and, with runtime updating on, from /v1/load_lora_adapter; each
gets a new lora_int_id, so an adapter loaded again under an old name never shares its
predecessor's prefix-cache blocks."""
import asyncio
import itertools
from dataclasses import dataclass, field

from gdserve.engine.async_llm import AsyncLLM
from gdserve.entrypoints.openai.errors import APIError, bad_request
from gdserve.entrypoints.openai.lora_modules import LoRAModulePath
from gdserve.lora.adapter import LoRALoadError
from gdserve.lora.request import LoRARequest


@dataclass
class ServingModels:
    engine: AsyncLLM
    base_model_name: str
    base_model_path: str | None = None  # the card's `root`
    lora_requests: dict[str, LoRARequest] = field(default_factory=dict)  # by lora_name
    _ids: itertools.count = field(default_factory=lambda: itertools.count(1))
    _lock: asyncio.Lock = field(default_factory=asyncio.Lock)  # one load or unload at a time

    def lora_request(self, model: str | None) -> LoRARequest | None:
        """The adapter a request's `model` names; None for the base model (or no `model`)."""
        if model is None or model == self.base_model_name:
            return None
        lora = self.lora_requests.get(model)
        if lora is None:
            raise APIError(404, f"The model `{model}` does not exist; this server serves "
                                f"`{self.base_model_name}`{self._adapters_hint()}.", "model", "model_not_found")
        return lora

    def _adapters_hint(self) -> str:
        return " and the LoRA adapters GET /v1/models lists" if self.engine.engine.lora is not None else ""

    def model_name(self, lora: LoRARequest | None) -> str:
        return lora.lora_name if lora is not None else self.base_model_name

    def cards(self, created: int, max_model_len: int) -> list[dict]:
        """/v1/models: the base model, then each adapter with its path (`root`) and base (`parent`)."""
        base = {"id": self.base_model_name, "object": "model", "created": created, "owned_by": "gdserve",
                "root": self.base_model_path, "parent": None, "max_model_len": max_model_len}
        return [base] + [{**base, "id": lora.lora_name, "root": lora.lora_path,
                          "parent": lora.base_model_name or self.base_model_name}
                         for lora in self.lora_requests.values()]

    async def load_lora_modules(self, modules: list[LoRAModulePath]) -> None:
        """Read the --lora-modules adapters in; a ValueError names the first that can't be."""
        for module in modules:
            try:
                await self._add(module.name, module.path, module.base_model_name)
            except ValueError as e:
                raise ValueError(f"--lora-modules {module.name}={module.path}: {e}") from None

    async def load_lora_adapter(self, lora_name: str, lora_path: str) -> LoRARequest:
        """POST /v1/load_lora_adapter: a 400 for a name in use or an adapter that can't be read."""
        async with self._lock:
            try:
                return await self._add(lora_name, lora_path)
            except LoRALoadError as e:
                raise bad_request(str(e), "lora_path") from None
            except ValueError as e:
                raise bad_request(str(e), "lora_name") from None

    async def unload_lora_adapter(self, lora_name: str | None, lora_int_id: int | None) -> LoRARequest:
        """POST /v1/unload_lora_adapter by name or id: a 404 for one not loaded. Requests already
        running with it finish (the engine reads it back from its directory if it must)."""
        if not lora_name and lora_int_id is None:
            raise bad_request("give lora_name or lora_int_id", "lora_name")
        async with self._lock:
            lora = self._find(lora_name, lora_int_id)
            del self.lora_requests[lora.lora_name]
            await self.engine.remove_lora(lora.lora_int_id)
            return lora

    def _find(self, lora_name: str | None, lora_int_id: int | None) -> LoRARequest:
        matches = [lora for lora in self.lora_requests.values()
                   if (not lora_name or lora.lora_name == lora_name)
                   and (lora_int_id is None or lora.lora_int_id == lora_int_id)]
        if not matches:
            what = f"'{lora_name}'" if lora_name else ""
            if lora_int_id is not None:
                what += f" with lora_int_id {lora_int_id}"
            raise APIError(404, f"The LoRA adapter {what.strip()} is not loaded.",
                           "lora_name" if lora_name else "lora_int_id", "lora_adapter_not_found")
        return matches[0]

    async def _add(self, name: str, path: str, base_model_name: str | None = None) -> LoRARequest:
        if not name or not path:
            raise ValueError("both lora_name and lora_path must be non-empty")
        if name == self.base_model_name:
            raise ValueError(f"the LoRA adapter name '{name}' is the base model's")
        if name in self.lora_requests:
            raise ValueError(f"the LoRA adapter '{name}' is already loaded (from "
                             f"{self.lora_requests[name].lora_path})")
        lora = LoRARequest(name, next(self._ids), path, base_model_name)
        await self.engine.add_lora(lora)  # LoRALoadError (a ValueError) names what is wrong
        self.lora_requests[name] = lora
        return lora
