"""Maps sequences to KV cache blocks: allocation, prefix-cache hits, swapping to CPU blocks and
back, and freeing."""
from gdserve.engine.block_pool import Block, BlockPool, hash_block
from gdserve.engine.request import SWAPPED, Sequence
from gdserve.engine.swap_space import SwapSpace


class KVCacheManager:
    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool = True,
                 num_swap_blocks: int = 0):
        self.block_size = block_size
        self.num_blocks = num_blocks
        self.enable_prefix_caching = enable_prefix_caching
        self.pool = BlockPool(num_blocks)
        self.swap_space = SwapSpace(num_swap_blocks)
        self.num_queries = 0   # prompt tokens looked up in the prefix cache
        self.num_hits = 0      # of those, tokens found

    @property
    def num_free_blocks(self) -> int:
        return self.pool.num_free_blocks

    @property
    def usage(self) -> float:
        return 1.0 - self.pool.num_free_blocks / self.num_blocks

    def get_computed_blocks(self, seq: Sequence) -> list[int]:
        """The longest run of cached full blocks that prefixes seq. At least one token is left
        uncomputed, since the step that computes it produces the logits to sample from."""
        if not self.enable_prefix_caching:
            return []
        seq.update_block_hashes(self.block_size, hash_block)
        max_blocks = (seq.num_tokens - 1) // self.block_size
        hits = []
        for block_hash, key in seq.block_hashes[:max_blocks]:
            block = self.pool.lookup(block_hash, key)
            if block is None:
                break
            hits.append(block.block_id)
        self.num_queries += seq.num_tokens
        self.num_hits += len(hits) * self.block_size
        return hits

    def allocate_slots(self, seq: Sequence, num_new_tokens: int, computed_blocks: list[int] = (),
                       reserve: int = 0) -> bool:
        """Grow seq's block table to hold num_new_tokens more tokens (after taking computed_blocks,
        for a newly admitted sequence). False, with nothing changed, if the pool is too small or
        would keep fewer than `reserve` blocks free."""
        num_cached = len(computed_blocks) * self.block_size
        total = max(seq.num_computed_tokens, num_cached) + num_new_tokens
        num_needed = -(-total // self.block_size) - len(seq.block_table) - len(computed_blocks)
        if num_needed <= 0 and not computed_blocks and not reserve:  # most decode steps: the last block has room
            return True
        num_reclaimed = sum(1 for b in computed_blocks if self.pool.blocks[b].ref_cnt == 0)
        if max(num_needed, 0) + reserve > self.pool.num_free_blocks - num_reclaimed:
            return False
        for block_id in computed_blocks:
            self.pool.touch(self.pool.blocks[block_id])
        seq.block_table.extend(computed_blocks)
        seq.block_table.extend(self.pool.allocate().block_id for _ in range(num_needed))
        return True

    def cache_full_blocks(self, seq: Sequence) -> None:
        """Register the blocks that seq's computed tokens have filled."""
        num_full = seq.num_computed_tokens // self.block_size
        if not self.enable_prefix_caching or num_full <= seq.num_registered_blocks:
            return
        seq.update_block_hashes(self.block_size, hash_block)
        for i in range(seq.num_registered_blocks, num_full):
            self.pool.register(self.pool.blocks[seq.block_table[i]], *seq.block_hashes[i])
        seq.num_registered_blocks = max(seq.num_registered_blocks, num_full)

    def swap_out(self, seq: Sequence) -> list[tuple[int, int]] | None:
        """Move the blocks of seq that no other sequence holds to the swap space and free them;
        blocks shared with others stay, still held by seq (never swapped twice). Returns the
        (device block, CPU block) copies to make before the blocks are written again, or None,
        with nothing changed, if the swap space lacks room."""
        own = [i for i, block_id in enumerate(seq.block_table) if self.pool.blocks[block_id].ref_cnt == 1]
        if len(own) > self.swap_space.num_free_blocks:
            return None
        copies = []
        for i, cpu_block in zip(reversed(own), self.swap_space.allocate(len(own))):
            copies.append((seq.block_table[i], cpu_block))
            self.pool.free(self.pool.blocks[seq.block_table[i]])  # tail first, as in free()
            seq.block_table[i] = SWAPPED
            seq.swapped_blocks[i] = cpu_block
        return copies[::-1]

    def swap_in(self, seq: Sequence, num_new_tokens: int) -> list[tuple[int, int]] | None:
        """Give a swapped-out seq device blocks again, and room for num_new_tokens more. A block
        still in the prefix cache is taken back as it is; the others are returned as (CPU block,
        device block) copies to make before the next forward. None, with nothing changed, if the
        pool is too small."""
        total = seq.num_computed_tokens + num_new_tokens
        num_needed = len(seq.swapped_blocks) + max(0, -(-total // self.block_size) - len(seq.block_table))
        if num_needed > self.pool.num_free_blocks:
            return None
        copies = []
        for i, cpu_block in sorted(seq.swapped_blocks.items()):
            block = self._cached(seq, i)
            if block is not None:
                self.pool.touch(block)
            else:
                block = self.pool.allocate()
                copies.append((cpu_block, block.block_id))
            seq.block_table[i] = block.block_id
        num_more = -(-total // self.block_size) - len(seq.block_table)
        seq.block_table.extend(self.pool.allocate().block_id for _ in range(num_more))
        self.swap_space.free(list(seq.swapped_blocks.values()))
        seq.swapped_blocks.clear()
        seq.num_registered_blocks = 0  # the fresh blocks are offered to the prefix cache again
        return copies

    def _cached(self, seq: Sequence, i: int) -> Block | None:
        """A prefix-cache block holding seq's i-th block (full and computed when it was swapped)."""
        if not self.enable_prefix_caching or i >= seq.num_registered_blocks:
            return None
        return self.pool.lookup(*seq.block_hashes[i])

    def free(self, seq: Sequence) -> None:
        # Tail blocks first, so the free list evicts a prefix's end before its start.
        for block_id in reversed(seq.block_table):
            if block_id != SWAPPED:
                self.pool.free(self.pool.blocks[block_id])
        self.swap_space.free(list(seq.swapped_blocks.values()))
        seq.swapped_blocks.clear()
        seq.block_table.clear()
        seq.num_registered_blocks = 0

    def reset_prefix_cache(self) -> None:
        self.pool.reset_prefix_cache()
