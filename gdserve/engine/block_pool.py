"""The KV cache's blocks: ref counts, prefix hashes and an LRU free list.

A full block is registered under a hash of (parent block's hash, its token ids, extra keys).
When its last user frees it, it stays registered in the free list, so a later request with the
same prefix can take it back (a prefix-cache hit) until the block is evicted for reuse.
"""
from collections import OrderedDict
from dataclasses import dataclass


@dataclass(eq=False)
class Block:
    block_id: int
    ref_cnt: int = 0
    block_hash: int | None = None
    # The key the hash was made from: checked on a hit so a hash collision is never a wrong hit.
    hash_key: tuple | None = None


def hash_block(parent_hash: int | None, token_ids: tuple[int, ...], extra_keys: tuple = ()) -> tuple[int, tuple]:
    key = (parent_hash, token_ids, extra_keys)
    return hash(key), key


class BlockPool:
    def __init__(self, num_blocks: int):
        self.blocks = [Block(i) for i in range(num_blocks)]
        # Free blocks, least recently freed first: eviction takes from the front.
        self.free_queue: OrderedDict[int, None] = OrderedDict((i, None) for i in range(num_blocks))
        self.cached: dict[int, Block] = {}

    @property
    def num_free_blocks(self) -> int:
        return len(self.free_queue)

    def lookup(self, block_hash: int, hash_key: tuple) -> Block | None:
        block = self.cached.get(block_hash)
        return block if block is not None and block.hash_key == hash_key else None

    def allocate(self) -> Block:
        block_id, _ = self.free_queue.popitem(last=False)
        block = self.blocks[block_id]
        if block.block_hash is not None:
            self._evict(block)
        block.ref_cnt = 1
        return block

    def touch(self, block: Block) -> None:
        """Take a reference to a (possibly free) cached block."""
        if block.ref_cnt == 0:
            del self.free_queue[block.block_id]
        block.ref_cnt += 1

    def free(self, block: Block) -> None:
        block.ref_cnt -= 1
        if block.ref_cnt == 0:
            self.free_queue[block.block_id] = None
            if block.block_hash is None:  # nothing worth keeping: reuse it first
                self.free_queue.move_to_end(block.block_id, last=False)

    def register(self, block: Block, block_hash: int, hash_key: tuple) -> None:
        """Make a full block findable by its hash (first writer wins on duplicates)."""
        if block.block_hash is not None or block_hash in self.cached:
            return
        block.block_hash, block.hash_key = block_hash, hash_key
        self.cached[block_hash] = block

    def reset_prefix_cache(self) -> None:
        for block in list(self.cached.values()):
            self._evict(block)

    def _evict(self, block: Block) -> None:
        del self.cached[block.block_hash]
        block.block_hash = block.hash_key = None
