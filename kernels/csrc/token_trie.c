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
   as cross_nodes[*n_cross] / cross_terms[*n_cross] in preorder; with `split` (lexemes may end at
   any complete match, grammar/cfg_lexer.py), every node below an accepting state, alive or not. A node reached in loop_states[l]
   whose descendants all read bytes that lead back to that state (pures[l][node], see
   grammar/token_index.py) has its whole subtree allowed without a walk: a string's interior is
   most of the vocabulary (n_loops is 0 when node_state is wanted; with `split`, an accepting loop
   state is walked node by node, each one a crossing). Returns how many bits it set. */
static int64_t walk_range(const int32_t *trans, int32_t n_classes, int32_t dead,
                          const uint8_t *node_class, const int32_t *depth, const int32_t *skip,
                          int32_t begin, int32_t end, const int32_t *tok_ptr, const int32_t *tok_ids,
                          int32_t state, int32_t vocab_size, uint32_t *words, int32_t *node_state,
                          const int32_t *accept, int32_t split, int32_t *cross_nodes,
                          int32_t *cross_terms, int64_t *n_cross, int32_t n_loops,
                          const int32_t *loop_states, const uint8_t *const *pures, int32_t *stack) {
    int64_t count = 0;
    int32_t base = depth[begin];
    stack[base - 1] = state;
    int32_t i = begin;
    while (i < end) {
        int32_t d = depth[i];
        int32_t s = trans[(int64_t)stack[d - 1] * n_classes + node_class[i]];
        int32_t term = accept && d > base ? accept[stack[d - 1]] : -1;
        if (term >= 0 && (split || s == dead)) {
            cross_nodes[*n_cross] = i;
            cross_terms[*n_cross] = term;
            (*n_cross)++;
        }
        if (s == dead) {
            i = skip[i];
            continue;
        }
        int32_t last = i + 1;
        for (int32_t l = 0; l < n_loops; l++) {
            if (s == loop_states[l]) {
                if (pures[l][i] && !(split && accept[s] >= 0)) last = skip[i];
                break;
            }
        }
        stack[d] = s;
        if (node_state) node_state[i] = s;
        for (int32_t k = tok_ptr[i]; k < tok_ptr[last]; k++) {
            int32_t t = tok_ids[k];
            if (t < vocab_size) {
                words[t >> 5] |= 1u << (t & 31);
                count++;
            }
        }
        i = last;
    }
    return count;
}

/* The whole trie (n_nodes nodes) from `state`; *n_cross is set to the crossings' count; the loops
   are ignored when node_state is wanted. */
int64_t walk_token_trie(const int32_t *trans, int32_t n_classes, int32_t dead,
                        const uint8_t *node_class, const int32_t *depth, const int32_t *skip,
                        int32_t n_nodes, const int32_t *tok_ptr, const int32_t *tok_ids,
                        int32_t state, int32_t vocab_size, uint32_t *words,
                        int32_t *node_state, const int32_t *accept, int32_t split,
                        int32_t *cross_nodes, int32_t *cross_terms, int64_t *n_cross, int32_t n_loops,
                        const int32_t *loop_states, const uint8_t *const *pures, int32_t *stack) {
    int64_t n = 0;
    int64_t count = n_nodes ? walk_range(trans, n_classes, dead, node_class, depth, skip, 0, n_nodes,
                                         tok_ptr, tok_ids, state, vocab_size, words, node_state,
                                         accept, split, cross_nodes, cross_terms, &n,
                                         node_state ? 0 : n_loops, loop_states, pures, stack) : 0;
    if (n_cross) *n_cross = n;
    return count;
}

/* The subtrees of roots[0..n_roots) (each root's byte read from `state`), with crossings below
   each root as in walk_range; *n_cross is set to their total count. */
int64_t walk_token_subtrees(const int32_t *trans, int32_t n_classes, int32_t dead,
                            const uint8_t *node_class, const int32_t *depth, const int32_t *skip,
                            const int32_t *roots, int32_t n_roots, const int32_t *tok_ptr,
                            const int32_t *tok_ids, int32_t state, int32_t vocab_size, uint32_t *words,
                            const int32_t *accept, int32_t split, int32_t *cross_nodes,
                            int32_t *cross_terms, int64_t *n_cross, int32_t n_loops,
                            const int32_t *loop_states, const uint8_t *const *pures, int32_t *stack) {
    int64_t count = 0, n = 0;
    for (int32_t r = 0; r < n_roots; r++)
        count += walk_range(trans, n_classes, dead, node_class, depth, skip, roots[r], skip[roots[r]],
                            tok_ptr, tok_ids, state, vocab_size, words, NULL, accept, split, cross_nodes,
                            cross_terms, &n, n_loops, loop_states, pures, stack);
    *n_cross = n;
    return count;
}

/* The loop states of a walk from `state` (see walk_range): following, up to `depth` bytes, the
   state that most bytes lead to, each state met that leads back to itself on at least min_bytes
   bytes (class_bytes[c]: how many bytes class c holds). Writes them to out; returns how many. */
int32_t find_loops(const int32_t *trans, int32_t n_classes, int32_t dead, const int32_t *class_bytes,
                   int32_t state, int32_t depth, int32_t min_bytes, int32_t *out) {
    int32_t n = 0, x = state;
    for (int32_t step = 0; step < depth && x != dead; step++) {
        const int32_t *row = trans + (int64_t)x * n_classes;
        int32_t looping = 0, best = dead, best_bytes = 0;
        for (int32_t c = 0; c < n_classes; c++) {
            int32_t t = row[c], seen = 0, total = 0;
            if (t == x) looping += class_bytes[c];
            if (t == dead) continue;
            for (int32_t c2 = 0; c2 < c && !seen; c2++) seen = row[c2] == t;
            if (seen) continue;
            for (int32_t c2 = c; c2 < n_classes; c2++)
                if (row[c2] == t) total += class_bytes[c2];
            if (total > best_bytes) {
                best_bytes = total;
                best = t;
            }
        }
        int32_t known = 0;
        for (int32_t k = 0; k < n; k++) known |= out[k] == x;
        if (looping >= min_bytes && !known) out[n++] = x;
        x = best;
    }
    return n;
}
