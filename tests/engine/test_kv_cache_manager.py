from gdserve.engine.block_pool import BlockPool, hash_block
from gdserve.engine.kv_cache_manager import KVCacheManager
from tests.engine.helpers import make_seq


def compute_all(kv: KVCacheManager, seq) -> None:
    assert kv.allocate_slots(seq, seq.num_tokens - seq.num_computed_tokens)
    seq.num_computed_tokens = seq.num_tokens
    kv.cache_full_blocks(seq)


def test_allocate_and_free_returns_every_block():
    kv = KVCacheManager(num_blocks=10, block_size=4)
    seq = make_seq(range(10))
    assert kv.allocate_slots(seq, 10)
    assert len(seq.block_table) == 3 and kv.num_free_blocks == 7
    seq.num_computed_tokens = 10
    assert kv.allocate_slots(seq, 3)           # 13 tokens: a fourth block
    assert len(seq.block_table) == 4
    kv.free(seq)
    assert kv.num_free_blocks == 10 and seq.block_table == []


def test_allocation_failure_changes_nothing():
    kv = KVCacheManager(num_blocks=2, block_size=4)
    seq = make_seq(range(12))
    assert not kv.allocate_slots(seq, 12)
    assert seq.block_table == [] and kv.num_free_blocks == 2


def test_prefix_hit_reuses_freed_blocks_and_leaves_one_token():
    kv = KVCacheManager(num_blocks=8, block_size=4)
    first = make_seq(list(range(10)))
    compute_all(kv, first)
    kv.free(first)
    same_prefix = make_seq(list(range(8)) + [99, 98, 97])
    hits = kv.get_computed_blocks(same_prefix)
    assert len(hits) == 2
    assert kv.allocate_slots(same_prefix, same_prefix.num_tokens - 8, hits)
    assert same_prefix.block_table[:2] == hits
    # An identical 8-token prompt may reuse only one block: its last token must be computed.
    exact = make_seq(list(range(8)))
    assert len(kv.get_computed_blocks(exact)) == 1


def test_hit_blocks_are_shared_and_ref_counted():
    kv = KVCacheManager(num_blocks=8, block_size=4)
    a = make_seq(list(range(9)))
    compute_all(kv, a)
    b = make_seq(list(range(9)))
    hits = kv.get_computed_blocks(b)
    assert hits == a.block_table[:2]
    assert kv.allocate_slots(b, 1, hits)
    assert all(kv.pool.blocks[i].ref_cnt == 2 for i in hits)
    kv.free(a)
    kv.free(b)
    assert kv.num_free_blocks == 8


def test_extra_keys_and_different_parents_do_not_hit():
    kv = KVCacheManager(num_blocks=8, block_size=4)
    a = make_seq(list(range(9)))
    compute_all(kv, a)
    kv.free(a)
    assert kv.get_computed_blocks(make_seq(list(range(9)), extra_keys=("lora-1",))) == []
    # Same second block, different first block: the chain hash tells them apart.
    assert kv.get_computed_blocks(make_seq([50, 1, 2, 3] + list(range(4, 9)))) == []


def test_lru_eviction_reuses_oldest_freed_blocks():
    kv = KVCacheManager(num_blocks=4, block_size=4)
    old = make_seq(list(range(9)))
    compute_all(kv, old)                      # 3 blocks, 2 of them full and cached
    kv.free(old)
    filler = make_seq(list(range(100, 116)))  # needs all 4 blocks: evicts the cached ones
    assert kv.allocate_slots(filler, 16)
    kv.free(filler)
    assert kv.get_computed_blocks(make_seq(list(range(9)))) == []


def test_disabled_prefix_caching_never_hits():
    kv = KVCacheManager(num_blocks=8, block_size=4, enable_prefix_caching=False)
    a = make_seq(list(range(9)))
    compute_all(kv, a)
    kv.free(a)
    assert kv.get_computed_blocks(make_seq(list(range(9)))) == []


def test_lookup_checks_the_key_not_only_the_hash():
    pool = BlockPool(2)
    block = pool.allocate()
    block_hash, key = hash_block(None, (1, 2, 3))
    pool.register(block, block_hash, key)
    assert pool.lookup(block_hash, key) is block
    assert pool.lookup(block_hash, (None, (4, 5, 6), ())) is None
