/* The token-mask walks of gdserve.grammar's lazy token index (grammar/token_index.py). */
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#define MAX_LOOPS 32   /* a walk's loop states */
#define LOOP_SLOTS 64  /* them by state, open addressing (twice as many) */

static int32_t loop_slot(int32_t state) {
    return (int32_t)(((uint32_t)state * 2654435761u) >> 26);
}

static void loop_table(int32_t *slots, int32_t n_loops, const int32_t *loop_states) {
    for (int32_t k = 0; k < LOOP_SLOTS; k++) slots[2 * k] = -1;
    for (int32_t l = 0; l < n_loops; l++) {
        int32_t k = loop_slot(loop_states[l]);
        while (slots[2 * k] >= 0) k = (k + 1) & (LOOP_SLOTS - 1);
        slots[2 * k] = loop_states[l];
        slots[2 * k + 1] = l;
    }
}

static int32_t loop_find(const int32_t *slots, int32_t state) {
    for (int32_t k = loop_slot(state); slots[2 * k] >= 0; k = (k + 1) & (LOOP_SLOTS - 1))
        if (slots[2 * k] == state) return slots[2 * k + 1];
    return -1;
}

/* Depth-first over the trie nodes [begin, end) (preorder, one subtree or the whole trie), the
   first node reading its byte class from `state` and each deeper one from its parent's DFA
   state; a dead state skips the node's whole subtree. Sets the bit of every token below
   vocab_size whose bytes never reach the dead state; writes each visited node's state to
   node_state when it is not NULL. When accept is not NULL (a context-free grammar's lexer,
   grammar/cfg/masks.py: accept[s] is the terminal state s emits, or -1), also records each node
   below the range's first level where the lexeme dies right after an accepting state, appended
   as cross_nodes[*n_cross] / cross_terms[*n_cross] in preorder; with `split` (lexemes may end at
   any complete match, grammar/cfg/lexer.py), every node below an accepting state, alive or not.
   A node reached in a loop state (loop l: loop_find(loop_slots, state), see loop_table) whose
   descendants all read bytes of the loop's set (pures[l][node], see grammar/token_index.py) and
   at most loop_limits[l] of them (below[node]) has its whole subtree allowed without a walk: a
   string's interior is most of the vocabulary (loop_slots is NULL when node_state is wanted;
   with `split`, an accepting loop state is walked node by node, each one a crossing).
   With base_classes (else NULL), the caller has already set the bits of the base row: the
   tokens whose bytes all lie in those classes, up to the row's length, all allowed from `state`
   (TokenIndex's base row: a string's characters). A node whose path and subtree read only such
   bytes (base_pure[node]: as pures), no more of them than base_len (the row's length, or
   INT32_MAX where one more is dead), is skipped whole: without its crossings (none: its nodes
   are alive, or dead past the row, and no state inside completes a terminal: see base_row), and
   node_state is not written for its nodes. on_path (max depth + 1) is scratch. Returns how many
   bits it set (bits already set not counted). */
static int64_t walk_range(const int32_t *trans, int32_t n_classes, int32_t dead,
                          const uint8_t *node_class, const int32_t *depth, const int32_t *skip,
                          int32_t begin, int32_t end, const int32_t *tok_ptr, const int32_t *tok_ids,
                          int32_t state, int32_t vocab_size, uint32_t *words, int32_t *node_state,
                          const int32_t *accept, int32_t split, int32_t *cross_nodes,
                          int32_t *cross_terms, int64_t *n_cross, const int32_t *loop_slots,
                          const uint8_t *const *pures, const int32_t *loop_limits,
                          const int32_t *below, const uint8_t *base_classes, const uint8_t *base_pure,
                          int32_t base_len, uint8_t *on_path, int32_t *stack) {
    int64_t count = 0;
    int32_t base = depth[begin];
    stack[base - 1] = state;
    if (base_classes) on_path[base - 1] = 1;
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
        if (base_classes) {
            on_path[d] = on_path[d - 1] && base_classes[node_class[i]];
            if (on_path[d] && base_pure[i] && below[i] <= base_len - d) {
                i = skip[i];
                continue;
            }
        }
        int32_t last = i + 1;
        if (loop_slots) {
            int32_t l = loop_find(loop_slots, s);
            if (l >= 0 && pures[l][i] && below[i] <= loop_limits[l] && !(split && accept[s] >= 0))
                last = skip[i];
        }
        stack[d] = s;
        if (node_state) node_state[i] = s;
        for (int32_t k = tok_ptr[i]; k < tok_ptr[last]; k++) {
            int32_t t = tok_ids[k];
            if (t < vocab_size) {
                uint32_t bit = 1u << (t & 31);
                count += !(words[t >> 5] & bit);
                words[t >> 5] |= bit;
            }
        }
        i = last;
    }
    return count;
}

/* The whole trie (n_nodes nodes) from `state`; *n_cross is set to the crossings' count; the loops
   are ignored when node_state is wanted (the nodes the base row covers keep theirs). */
int64_t walk_token_trie(const int32_t *trans, int32_t n_classes, int32_t dead,
                        const uint8_t *node_class, const int32_t *depth, const int32_t *skip,
                        int32_t n_nodes, const int32_t *tok_ptr, const int32_t *tok_ids,
                        int32_t state, int32_t vocab_size, uint32_t *words,
                        int32_t *node_state, const int32_t *accept, int32_t split,
                        int32_t *cross_nodes, int32_t *cross_terms, int64_t *n_cross, int32_t n_loops,
                        const int32_t *loop_states, const uint8_t *const *pures,
                        const int32_t *loop_limits, const int32_t *below, const uint8_t *base_classes,
                        const uint8_t *base_pure, int32_t base_len, uint8_t *on_path, int32_t *stack) {
    int64_t n = 0;
    int32_t slots[2 * LOOP_SLOTS];
    loop_table(slots, node_state ? 0 : n_loops, loop_states);
    int64_t count = n_nodes ? walk_range(trans, n_classes, dead, node_class, depth, skip, 0, n_nodes,
                                         tok_ptr, tok_ids, state, vocab_size, words, node_state,
                                         accept, split, cross_nodes, cross_terms, &n,
                                         node_state || !n_loops ? NULL : slots, pures, loop_limits,
                                         below, base_classes, base_pure, base_len, on_path, stack) : 0;
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
                            const int32_t *loop_states, const uint8_t *const *pures,
                            const int32_t *loop_limits, const int32_t *below, int32_t *stack) {
    int64_t count = 0, n = 0;
    int32_t slots[2 * LOOP_SLOTS];
    loop_table(slots, n_loops, loop_states);
    for (int32_t r = 0; r < n_roots; r++)
        count += walk_range(trans, n_classes, dead, node_class, depth, skip, roots[r], skip[roots[r]],
                            tok_ptr, tok_ids, state, vocab_size, words, NULL, accept, split, cross_nodes,
                            cross_terms, &n, n_loops ? slots : NULL, pures, loop_limits, below, NULL, NULL, 0,
                            NULL, stack);
    *n_cross = n;
    return count;
}

/* How many bytes of the set that leads x to `next` x reads and stays alive, through states that
   complete no terminal where `split`: INT32_MAX where they come back to a state, else up to
   max_run. */
static int32_t run_length(const int32_t *trans, int32_t n_classes, int32_t dead, const int32_t *accept,
                          int32_t split, int32_t x, int32_t next, int32_t max_run) {
    const int32_t *row = trans + (int64_t)x * n_classes;
    if (next == x) return INT32_MAX;
    int32_t limit = 1;
    for (int32_t y = next; limit < max_run && !(split && accept && accept[y] >= 0); limit++) {
        const int32_t *ry = trans + (int64_t)y * n_classes;
        int32_t z = -1;
        for (int32_t c = 0; c < n_classes; c++) {
            if (row[c] != next) continue;
            if (z < 0) z = ry[c];
            else if (ry[c] != z) return limit;
        }
        if (z == dead) return limit;
        if (z == y) return INT32_MAX;
        y = z;
    }
    return limit;
}

/* Whether the classes that lead x to nx are those that lead y to ny. */
static int32_t same_set(const int32_t *trans, int32_t n_classes, int32_t x, int32_t nx, int32_t y, int32_t ny) {
    const int32_t *rx = trans + (int64_t)x * n_classes, *ry = trans + (int64_t)y * n_classes;
    for (int32_t c = 0; c < n_classes; c++)
        if ((rx[c] == nx) != (ry[c] == ny)) return 0;
    return 1;
}

static int32_t in_set(const uint8_t *set, int32_t b) {
    return (set[b >> 3] >> (7 - (b & 7))) & 1;
}

/* The base row of a walk from `state` (see walk_range), where one of the n loops found is one
   that exactly the bytes of its set lead to from `state` (a string's characters): out_base =
   {that loop's index, the row's most bytes (its limit + 1, at most max_run), the walk's base_len
   (INT32_MAX where one more byte of the set after that many is dead, or the most is max_run:
   then the walk skips only-set subtrees of any length)}; {-1, 0, 0} where none is. With `split`,
   only where none of the states those bytes lead through completes a terminal (accept): the
   skipped subtrees then hold no crossing. */
static void base_row(const int32_t *trans, int32_t n_classes, int32_t dead, const uint8_t *byte_class,
                     const int32_t *accept, int32_t split, int32_t state, int32_t n, const int32_t *loops,
                     const int32_t *limits, const uint8_t *sets, int32_t max_run, int32_t *out_base) {
    const int32_t *row = trans + (int64_t)state * n_classes;
    out_base[0] = -1, out_base[1] = out_base[2] = 0;
    for (int32_t e = 0; e < n; e++) {
        int32_t b = 0, first = -1;
        for (; b < 256 && (row[byte_class[b]] == loops[e]) == in_set(sets + 32 * e, b); b++)
            if (first < 0 && in_set(sets + 32 * e, b)) first = b;
        if (b < 256 || first < 0) continue;
        int32_t most = limits[e] >= max_run ? max_run : limits[e] + 1, end = state, closes = 1;
        for (int32_t k = 0; k < most && most < max_run; k++)
            end = trans[(int64_t)end * n_classes + byte_class[first]];
        for (b = 0; b < 256 && most < max_run; b++)
            if (in_set(sets + 32 * e, b) && trans[(int64_t)end * n_classes + byte_class[b]] != dead) closes = 0;
        int32_t k = 0;
        for (int32_t y = state; split && accept && k < most; k++)
            if (accept[y = trans[(int64_t)y * n_classes + byte_class[first]]] >= 0) break;
        if (split && accept && k < most) continue;
        out_base[0] = e, out_base[1] = most, out_base[2] = closes ? INT32_MAX : most;
        return;
    }
}

/* The loop states of a walk from `state` (see walk_range): following, up to `depth` bytes (up to
   count_depth while each state counts down to the next), the state that most bytes lead to,
   each state x met where at least min_bytes bytes (class_bytes[c]: how many bytes class c
   holds) lead back to x, or else lead on to one state. Writes x to out, those bytes to out_set
   (32 bytes each: bit 0x80 >> (b & 7) of byte b >> 3, np.packbits' order),
   and to out_limit how many bytes of that set x reads and stays alive (run_length): unbounded
   where they lead back (a string's interior), a count down (a string of at most n characters)
   up to max_run, listed only from min_run on. Returns how many (at most MAX_LOOPS); out_base is
   their base row (base_row). */
int32_t find_loops(const int32_t *trans, int32_t n_classes, int32_t dead, const int32_t *class_bytes,
                   const uint8_t *byte_class, const int32_t *accept, int32_t split, int32_t state,
                   int32_t depth, int32_t count_depth, int32_t min_bytes, int32_t min_run, int32_t max_run,
                   int32_t *out, int32_t *out_limit, uint8_t *out_set, int32_t *out_base) {
    int32_t out_next[MAX_LOOPS];
    int32_t n = 0, x = state, succ[256], succ_bytes[256], counting = 0;
    for (int32_t step = 0; (step < depth || (counting && step < count_depth)) && x != dead; step++) {
        const int32_t *row = trans + (int64_t)x * n_classes;
        int32_t looping = 0, best = dead, best_bytes = 0, n_succ = 0;
        for (int32_t c = 0; c < n_classes; c++) {
            int32_t t = row[c], k = 0;
            if (t == x) looping += class_bytes[c];
            if (t == dead) continue;
            while (k < n_succ && succ[k] != t) k++;
            if (k == n_succ) {
                succ[n_succ] = t;
                succ_bytes[n_succ++] = 0;
            }
            succ_bytes[k] += class_bytes[c];
        }
        for (int32_t k = 0; k < n_succ; k++)
            if (succ_bytes[k] > best_bytes) {
                best_bytes = succ_bytes[k];
                best = succ[k];
            }
        int32_t known = 0, next = looping >= min_bytes ? x : best_bytes >= min_bytes ? best : dead;
        for (int32_t k = 0; k < n; k++) known |= out[k] == x;
        counting = 0;
        if (!known && next != dead && n < MAX_LOOPS && !(split && accept && accept[x] >= 0)) {
            out[n] = x;
            out_next[n++] = next;
            counting = next != x;
        }
        x = best;
    }
    /* Last first: a count down's next state is the entry after it, with the same set. */
    for (int32_t e = n - 1; e >= 0; e--) {
        int32_t x = out[e], next = out_next[e];
        if (next != x && e + 1 < n && out[e + 1] == next && same_set(trans, n_classes, x, next, next, out_next[e + 1]))
            out_limit[e] = out_limit[e + 1] == INT32_MAX ? INT32_MAX
                         : out_limit[e + 1] + 1 < max_run ? out_limit[e + 1] + 1 : max_run;
        else
            out_limit[e] = run_length(trans, n_classes, dead, accept, split, x, next, max_run);
    }
    /* Kept: loops, and count downs of min_run bytes or more past the start (a shorter one, or a
       step into a loop, is walked: one more byte set to keep is dearer). */
    int32_t kept = 0;
    for (int32_t e = 0; e < n; e++) {
        if (out_next[e] != out[e] && (out_limit[e] < min_run || out_limit[e] == INT32_MAX || out[e] == state))
            continue;
        const int32_t *row = trans + (int64_t)out[e] * n_classes;
        memset(out_set + 32 * kept, 0, 32);
        for (int32_t b = 0; b < 256; b++)  /* np.packbits' order */
            if (row[byte_class[b]] == out_next[e]) out_set[32 * kept + (b >> 3)] |= (uint8_t)(0x80 >> (b & 7));
        out[kept] = out[e];
        out_limit[kept++] = out_limit[e];
    }
    base_row(trans, n_classes, dead, byte_class, accept, split, state, kept, out, out_limit, out_set, max_run, out_base);
    return kept;
}

/* Each token's distance to completion after it (grammar/token_index.py's next_distances):
   out[t] = distance[node_state[token_node[t]]] for t < n_tokens, a token without a node reading
   node_state[n_nodes] (the dead state's, -1); where lengths is not NULL, a token whose bytes
   all lie in the base row's set (lengths[t] <= most) takes by_length[lengths[t]] instead: the
   walk skipped its node, and its end follows from its length. */
void token_distances(const int32_t *node_state, int32_t n_nodes, const int32_t *token_node, int32_t n_tokens,
                     const int32_t *distance, const int32_t *lengths, int32_t most, const int32_t *by_length,
                     int32_t *out) {
    for (int32_t t = 0; t < n_tokens; t++) {
        if (lengths && lengths[t] <= most) {
            out[t] = by_length[lengths[t]];
            continue;
        }
        int32_t node = token_node[t];
        out[t] = distance[node_state[node < 0 ? n_nodes : node]];
    }
}

/* Tokens in the greedy tokenization of text[0..n) (from each position the longest token below
   vocab_size that the rest starts with), or -1 where no token starts at some position. first[b]:
   the depth-1 node reading byte b (-1: none); the children of a node lie in its preorder
   subtree, one after another through skip. */
int64_t greedy_token_count(const uint8_t *byte, const int32_t *skip, const int32_t *first, const int32_t *tok_ptr,
                           const int32_t *tok_ids, int32_t vocab_size, const uint8_t *text, int64_t n) {
    int64_t count = 0;
    for (int64_t i = 0; i < n; count++) {
        int64_t longest = 0;
        for (int32_t c = first[text[i]], j = 0; c >= 0;) {
            for (int32_t k = tok_ptr[c]; k < tok_ptr[c + 1]; k++)
                if (tok_ids[k] < vocab_size) { longest = j + 1; break; }
            if (++j >= n - i) break;
            int32_t end = skip[c];
            for (c++; c < end && byte[c] != text[i + j]; c = skip[c]) {}
            if (c >= end) break;
        }
        if (!longest) return -1;
        i += longest;
    }
    return count;
}
