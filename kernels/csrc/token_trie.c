/* The token-mask walks of gdserve.grammar's lazy token index (grammar/token_index.py). */
#include <stddef.h>
#include <stdint.h>

/* Depth-first over the trie nodes [begin, end) (preorder, one subtree or the whole trie), the
   first node reading its byte class from `state` and each deeper one from its parent's DFA
   state; a dead state skips the node's whole subtree. Sets the bit of every token below
   vocab_size whose bytes never reach the dead state; writes each visited node's state to
   node_state when it is not NULL. When accept is not NULL (a context-free grammar's lexer,
   grammar/cfg_masks.py: accept[s] is the terminal state s emits, or -1), also records each node
   below the range's first level where the lexeme dies right after an accepting state, appended
   as cross_nodes[*n_cross] / cross_terms[*n_cross] in preorder. Returns how many bits it set. */
static int64_t walk_range(const int32_t *trans, int32_t n_classes, int32_t dead,
                          const uint8_t *node_class, const int32_t *depth, const int32_t *skip,
                          int32_t begin, int32_t end, const int32_t *tok_ptr, const int32_t *tok_ids,
                          int32_t state, int32_t vocab_size, uint32_t *words, int32_t *node_state,
                          const int32_t *accept, int32_t *cross_nodes, int32_t *cross_terms,
                          int64_t *n_cross, int32_t *stack) {
    int64_t count = 0;
    int32_t base = depth[begin];
    stack[base - 1] = state;
    int32_t i = begin;
    while (i < end) {
        int32_t d = depth[i];
        int32_t s = trans[(int64_t)stack[d - 1] * n_classes + node_class[i]];
        if (s == dead) {
            int32_t term = accept && d > base ? accept[stack[d - 1]] : -1;
            if (term >= 0) {
                cross_nodes[*n_cross] = i;
                cross_terms[*n_cross] = term;
                (*n_cross)++;
            }
            i = skip[i];
            continue;
        }
        stack[d] = s;
        if (node_state) node_state[i] = s;
        for (int32_t k = tok_ptr[i]; k < tok_ptr[i + 1]; k++) {
            int32_t t = tok_ids[k];
            if (t < vocab_size) {
                words[t >> 5] |= 1u << (t & 31);
                count++;
            }
        }
        i++;
    }
    return count;
}

/* The whole trie (n_nodes nodes) from `state`; *n_cross is set to the crossings' count. */
int64_t walk_token_trie(const int32_t *trans, int32_t n_classes, int32_t dead,
                        const uint8_t *node_class, const int32_t *depth, const int32_t *skip,
                        int32_t n_nodes, const int32_t *tok_ptr, const int32_t *tok_ids,
                        int32_t state, int32_t vocab_size, uint32_t *words,
                        int32_t *node_state, const int32_t *accept, int32_t *cross_nodes,
                        int32_t *cross_terms, int64_t *n_cross, int32_t *stack) {
    int64_t n = 0;
    int64_t count = n_nodes ? walk_range(trans, n_classes, dead, node_class, depth, skip, 0, n_nodes,
                                         tok_ptr, tok_ids, state, vocab_size, words, node_state,
                                         accept, cross_nodes, cross_terms, &n, stack) : 0;
    if (n_cross) *n_cross = n;
    return count;
}

/* The subtrees of roots[0..n_roots) (each root's byte read from `state`), with crossings below
   each root as in walk_range; *n_cross is set to their total count. */
int64_t walk_token_subtrees(const int32_t *trans, int32_t n_classes, int32_t dead,
                            const uint8_t *node_class, const int32_t *depth, const int32_t *skip,
                            const int32_t *roots, int32_t n_roots, const int32_t *tok_ptr,
                            const int32_t *tok_ids, int32_t state, int32_t vocab_size, uint32_t *words,
                            const int32_t *accept, int32_t *cross_nodes, int32_t *cross_terms,
                            int64_t *n_cross, int32_t *stack) {
    int64_t count = 0, n = 0;
    for (int32_t r = 0; r < n_roots; r++)
        count += walk_range(trans, n_classes, dead, node_class, depth, skip, roots[r], skip[roots[r]],
                            tok_ptr, tok_ids, state, vocab_size, words, NULL, accept, cross_nodes,
                            cross_terms, &n, stack);
    *n_cross = n;
    return count;
}
