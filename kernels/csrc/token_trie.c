/* The token-mask walk of gdserve.grammar's lazy token index (grammar/token_index.py). */
#include <stdint.h>

/* Depth-first over the token trie (nodes in preorder), reading each node's byte class from the
   DFA state of its parent; a dead state skips the node's whole subtree. Sets the bit of every
   token below vocab_size whose bytes never reach the dead state; writes each visited node's
   state to node_state when it is not NULL (the others keep what they had). When accept is not
   NULL (a context-free grammar's lexer, grammar/cfg_masks.py: accept[s] is the terminal state s
   emits, or -1), also records each node below depth 1 where the lexeme dies right after an
   accepting state, as cross_nodes[k] / cross_terms[k] in preorder, their count in *n_cross.
   Returns how many bits it set. */
int64_t walk_token_trie(const int32_t *trans, int32_t n_classes, int32_t dead,
                        const uint8_t *node_class, const int32_t *depth, const int32_t *skip,
                        int32_t n_nodes, const int32_t *tok_ptr, const int32_t *tok_ids,
                        int32_t state, int32_t vocab_size, uint32_t *words,
                        int32_t *node_state, const int32_t *accept, int32_t *cross_nodes,
                        int32_t *cross_terms, int64_t *n_cross, int32_t *stack) {
    int64_t count = 0, n = 0;
    stack[0] = state;
    int32_t i = 0;
    while (i < n_nodes) {
        int32_t d = depth[i];
        int32_t s = trans[(int64_t)stack[d - 1] * n_classes + node_class[i]];
        if (s == dead) {
            int32_t term = accept && d > 1 ? accept[stack[d - 1]] : -1;
            if (term >= 0) {
                cross_nodes[n] = i;
                cross_terms[n] = term;
                n++;
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
    if (n_cross) *n_cross = n;
    return count;
}
