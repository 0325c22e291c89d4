"""Where adapters live: read from disk into CPU memory (an LRU of `max_cpu_loras`), and copied into
one of the model's `max_loras` GPU slots (an LRU too) when a step's batch uses them."""
from collections import OrderedDict
from collections.abc import Iterable

import torch

from gdserve.lora.adapter import LoRAAdapter, LoRALoadError, load_adapter
from gdserve.lora.layers import LoRALinear
from gdserve.lora.request import LoRARequest


class LoRAManager:
    def __init__(self, model: torch.nn.Module, layers: dict[str, LoRALinear], max_loras: int,
                 max_cpu_loras: int, max_rank: int, dtype: torch.dtype):
        self.model = model
        self.layers = layers
        self.max_rank = max_rank
        self.max_cpu_loras = max_cpu_loras
        self.dtype = dtype
        self.adapters: OrderedDict[int, tuple[LoRARequest, LoRAAdapter]] = OrderedDict()  # CPU, LRU order
        self.slots: list[int | None] = [None] * max_loras  # slot -> lora_int_id
        self.slot_lru: OrderedDict[int, int] = OrderedDict()  # lora_int_id -> slot, LRU order

    def add(self, request: LoRARequest) -> bool:
        """Read the adapter into CPU memory unless it is there already; False if it was. A
        LoRALoadError names what is wrong with the adapter directory."""
        loaded = self.adapters.get(request.lora_int_id)
        if loaded is not None:
            if loaded[0].lora_path != request.lora_path:
                raise LoRALoadError(f"lora_int_id {request.lora_int_id} is already adapter "
                                    f"{loaded[0].lora_name!r} from {loaded[0].lora_path!r}; "
                                    f"give {request.lora_path!r} another id")
            self.adapters.move_to_end(request.lora_int_id)
            return False
        adapter = load_adapter(request.lora_path, self.model, self.max_rank, self.dtype)
        self.adapters[request.lora_int_id] = (request, adapter)
        self._evict_cpu()
        return True

    def remove(self, lora_int_id: int) -> bool:
        found = self.adapters.pop(lora_int_id, None) is not None
        slot = self.slot_lru.pop(lora_int_id, None)
        if slot is not None:
            self.slots[slot] = None
            found = True
        return found

    def list(self) -> set[int]:
        return set(self.adapters) | set(self.slot_lru)

    def activate(self, requests: Iterable[LoRARequest]) -> dict[int, int]:
        """Give each adapter of a step a GPU slot (at most max_loras distinct: the scheduler's
        rule), reading back from disk one that left the CPU cache; returns lora_int_id -> slot."""
        wanted = {r.lora_int_id: r for r in requests}
        if len(wanted) > len(self.slots):
            raise ValueError(f"a step uses {len(wanted)} adapters; max_loras is {len(self.slots)}")
        for lora_int_id in wanted:
            if lora_int_id in self.slot_lru:
                self.slot_lru.move_to_end(lora_int_id)
        for lora_int_id, request in wanted.items():
            if lora_int_id not in self.slot_lru:
                self._load_slot(request, self._free_slot(wanted))
        return {i: self.slot_lru[i] for i in wanted}

    def _free_slot(self, keep: dict[int, LoRARequest]) -> int:
        if None in self.slots:
            return self.slots.index(None)
        victim = next(i for i in self.slot_lru if i not in keep)
        slot = self.slot_lru.pop(victim)
        self.slots[slot] = None
        return slot

    def _load_slot(self, request: LoRARequest, slot: int) -> None:
        self.add(request)
        _, adapter = self.adapters[request.lora_int_id]
        for name, layer in self.layers.items():
            layer.set_slot(slot, adapter.layers.get(name))
        self.slots[slot] = request.lora_int_id
        self.slot_lru[request.lora_int_id] = slot

    def _evict_cpu(self) -> None:
        while len(self.adapters) > self.max_cpu_loras:
            self.adapters.popitem(last=False)
