"""AttentionMetadata.build: a step's flat tokens as attention rows. The leading sequences' tokens
(decodes, forced text) become decode rows, each seeing the keys up to its own position; the other
chunks stay whole, after them."""
import torch

from gdserve.layers.attention import SHORT_CHUNK, AttentionMetadata


def test_short_sequences_become_a_decode_row_per_token():
    block_size, long = 4, SHORT_CHUNK + 4
    tables = [[7, 8], [3, 4, 5], [0, 1, 2, 9, 10, 11, 12, 13]]
    starts, query_lens = [5, 6, 2], [1, 3, long]
    positions, meta = AttentionMetadata.build(tables, starts, query_lens, block_size, num_short=2)
    assert positions.tolist() == [5, 6, 7, 8, *range(2, 2 + long)]
    assert meta.num_decodes == 4
    assert meta.query_lens == [1, 1, 1, 1, long]
    assert meta.seq_lens == [6, 7, 8, 9, 2 + long]  # each of the chunk's rows sees up to itself
    assert meta.seq_lens_tensor.tolist() == meta.seq_lens
    assert meta.query_start_loc.tolist() == [0, 1, 2, 3, 4, 4 + long]
    rows = meta.block_tables.tolist()
    assert [r[:len(t)] for r, t in zip(rows, [tables[0], tables[1], tables[1], tables[1], tables[2]])] == \
        [tables[0], tables[1], tables[1], tables[1], tables[2]]
    slot = [tables[s][p // block_size] * block_size + p % block_size
            for s, p in zip([0, 1, 1, 1] + [2] * long, positions.tolist())]
    assert meta.slot_mapping.tolist() == slot


def test_a_step_of_short_sequences_is_all_decode_rows():
    positions, meta = AttentionMetadata.build([[0], [1, 2]], [0, 3], [2, 2], 4, num_short=2)
    assert meta.num_decodes == 4 == len(meta.query_lens) == positions.numel()
    assert meta.seq_lens == [1, 2, 4, 5] and meta.block_tables.dtype == torch.int32


def test_by_default_only_single_tokens_are_decode_rows():
    _, meta = AttentionMetadata.build([[0], [1, 2], [3]], [4, 3, 0], [1, 2, 3], 4)
    assert meta.num_decodes == 1 and meta.query_lens == [1, 2, 3] and meta.seq_lens == [5, 5, 3]
