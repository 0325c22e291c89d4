"""The CPU blocks that preempted sequences' KV blocks are swapped out to (swap_space GiB).

Only the ids are kept here; the bytes live in the model runner's CPU cache. Blocks are handed out
lowest id first, so a sequence's blocks tend to form runs the runner copies in one transfer each.
"""
import heapq


class SwapSpace:
    def __init__(self, num_blocks: int):
        self.num_blocks = num_blocks
        self._free = list(range(num_blocks))  # a heap

    @property
    def num_free_blocks(self) -> int:
        return len(self._free)

    def allocate(self, num: int) -> list[int]:
        if num > len(self._free):
            raise ValueError(f"swap space has {len(self._free)} free blocks, {num} requested")
        return [heapq.heappop(self._free) for _ in range(num)]

    def free(self, block_ids: list[int]) -> None:
        for block_id in block_ids:
            heapq.heappush(self._free, block_id)
