/* Subset construction of a byte NFA (grammar/regex/nfa.py: Thompson's construction, epsilon and
   byte-class-range edges in CSR form) into a DFA whose states are interned by their NFA node
   sets. A DFA state holds the nodes of its epsilon closure that read a byte or accept, and only
   those from which the accepting node can be reached (the NFA's own distance to it, computed
   first, is finite): a set left empty is the dead state, so every live DFA state can complete,
   and a state's distance to completion is the least of its nodes'. State 0 is the dead state
   (its row all 0); a state's row is filled when it is expanded (byte_dfa_expand), 0s until
   then, so a caller may build all states or only those it reaches (byte_dfa_reach: all within
   so many bytes of a state, what a token walk from it reads). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define UNREACHED INT32_MAX
#define FAR (INT64_MAX / 2)  /* grammar/token_index.py's UNREACHABLE */

typedef struct {
    int32_t n_nodes, n_classes, accept;
    const int32_t *eps_ptr, *eps_to, *edge_ptr, *edge_lo, *edge_hi, *edge_to;
    int32_t *dist;                     /* per NFA node: fewest bytes to the accepting node */
    int32_t n_states, cap_states, max_states;
    int32_t *trans;                    /* [cap_states * n_classes] */
    uint8_t *final, *expanded;
    int64_t *sdist;                    /* FAR where no accepting state can be reached */
    int32_t *ready;                    /* per state: every state within this many bytes is expanded (-1: none) */
    int32_t *order, n_order;           /* the states in the order they were expanded */
    int32_t *queue;
    int64_t *set_off;                  /* [cap_states + 1]: a state's nodes are pool[set_off[s]..set_off[s + 1]) */
    int32_t *pool;
    int64_t pool_cap;
    int32_t *slots;                    /* open addressing, state ids (-1: empty) */
    int64_t n_slots;
    uint64_t *hashes;                  /* per state */
    uint32_t *mark, gen;               /* per NFA node: visited in closure `gen` */
    int32_t *stack, *out, *seeds, *edges;
    uint8_t *changed;
    int64_t edge_cap;                  /* edges and seeds hold this many */
    int failed;
} Builder;

static void *grow(void *p, int64_t n, int64_t size, int *failed) {
    void *q = realloc(p, (size_t)(n * size));
    if (!q) *failed = 1;
    return q ? q : p;
}

/* Least bytes from each node to the accepting node: breadth-first over reversed edges, by
   levels, an epsilon edge adding none. */
static int nfa_distances(Builder *b) {
    int32_t n = b->n_nodes;
    int64_t n_eps = b->eps_ptr[n], n_edges = b->edge_ptr[n];
    int32_t *eps_rp = calloc((size_t)n + 1, sizeof(int32_t)), *eps_rs = malloc((size_t)(n_eps + 1) * sizeof(int32_t));
    int32_t *byte_rp = calloc((size_t)n + 1, sizeof(int32_t)), *byte_rs = malloc((size_t)(n_edges + 1) * sizeof(int32_t));
    int32_t *cur = malloc((size_t)n * sizeof(int32_t)), *next = malloc((size_t)n * sizeof(int32_t));
    if (!eps_rp || !eps_rs || !byte_rp || !byte_rs || !cur || !next) goto fail;
    for (int32_t u = 0; u < n; u++) {
        for (int32_t k = b->eps_ptr[u]; k < b->eps_ptr[u + 1]; k++) eps_rp[b->eps_to[k] + 1]++;
        for (int32_t k = b->edge_ptr[u]; k < b->edge_ptr[u + 1]; k++) byte_rp[b->edge_to[k] + 1]++;
    }
    for (int32_t u = 0; u < n; u++) eps_rp[u + 1] += eps_rp[u], byte_rp[u + 1] += byte_rp[u];
    for (int32_t u = n - 1; u >= 0; u--) {
        for (int32_t k = b->eps_ptr[u]; k < b->eps_ptr[u + 1]; k++) eps_rs[--eps_rp[b->eps_to[k] + 1]] = u;
        for (int32_t k = b->edge_ptr[u]; k < b->edge_ptr[u + 1]; k++) byte_rs[--byte_rp[b->edge_to[k] + 1]] = u;
    }
    /* the decrements above left rp[v + 1] at v's first slot: v's block ends at rp[v + 2] */
    for (int32_t u = 0; u < n; u++) b->dist[u] = UNREACHED;
    int32_t n_cur = 0, level = 0;
    b->dist[b->accept] = 0;
    cur[n_cur++] = b->accept;
    while (n_cur) {
        for (int32_t i = 0; i < n_cur; i++) {  /* cur grows while read: the level's epsilon closure */
            int32_t v = cur[i];
            for (int32_t k = eps_rp[v + 1]; k < (v + 1 < n ? eps_rp[v + 2] : n_eps); k++) {
                int32_t p = eps_rs[k];
                if (b->dist[p] > level) {
                    b->dist[p] = level;
                    cur[n_cur++] = p;
                }
            }
        }
        int32_t n_next = 0;
        for (int32_t i = 0; i < n_cur; i++) {
            int32_t v = cur[i];
            for (int32_t k = byte_rp[v + 1]; k < (v + 1 < n ? byte_rp[v + 2] : n_edges); k++) {
                int32_t p = byte_rs[k];
                if (b->dist[p] == UNREACHED) {
                    b->dist[p] = level + 1;
                    next[n_next++] = p;
                }
            }
        }
        int32_t *t = cur; cur = next; next = t;
        n_cur = n_next;
        level++;
    }
    free(eps_rp), free(eps_rs), free(byte_rp), free(byte_rs), free(cur), free(next);
    return 0;
fail:
    free(eps_rp), free(eps_rs), free(byte_rp), free(byte_rs), free(cur), free(next);
    return -1;
}

static int cmp_int32(const void *a, const void *b) {
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return (x > y) - (x < y);
}

static uint64_t hash_set(const int32_t *s, int64_t n) {
    uint64_t h = 1469598103934665603ull;
    for (int64_t i = 0; i < n; i++) h = (h ^ (uint32_t)s[i]) * 1099511628211ull;
    return h ^ (uint64_t)n;
}

static int rehash(Builder *b) {
    int64_t n_slots = b->n_slots * 2;
    int32_t *slots = malloc((size_t)n_slots * sizeof(int32_t));
    if (!slots) return -1;
    memset(slots, 0xff, (size_t)n_slots * sizeof(int32_t));
    for (int32_t s = 1; s < b->n_states; s++) {
        int64_t k = (int64_t)(b->hashes[s] & (uint64_t)(n_slots - 1));
        while (slots[k] >= 0) k = (k + 1) & (n_slots - 1);
        slots[k] = s;
    }
    free(b->slots);
    b->slots = slots;
    b->n_slots = n_slots;
    return 0;
}

/* The state of the live closure of seeds[0..n_seeds): found or added (0: dead, -3: out of
   states or memory). */
static int32_t intern_closure(Builder *b, int32_t n_seeds) {
    int64_t n_out = 0, top = 0;
    if (++b->gen == 0) {
        memset(b->mark, 0, (size_t)b->n_nodes * sizeof(uint32_t));
        b->gen = 1;
    }
    for (int32_t i = 0; i < n_seeds; i++) {
        int32_t u = b->seeds[i];
        if (b->mark[u] != b->gen && b->dist[u] != UNREACHED) {
            b->mark[u] = b->gen;
            b->stack[top++] = u;
        }
    }
    while (top) {
        int32_t u = b->stack[--top];
        if (b->edge_ptr[u + 1] > b->edge_ptr[u] || u == b->accept) b->out[n_out++] = u;
        for (int32_t k = b->eps_ptr[u]; k < b->eps_ptr[u + 1]; k++) {
            int32_t v = b->eps_to[k];
            if (b->mark[v] != b->gen && b->dist[v] != UNREACHED) {
                b->mark[v] = b->gen;
                b->stack[top++] = v;
            }
        }
    }
    if (!n_out) return 0;
    qsort(b->out, (size_t)n_out, sizeof(int32_t), cmp_int32);
    uint64_t h = hash_set(b->out, n_out);
    int64_t k = (int64_t)(h & (uint64_t)(b->n_slots - 1));
    for (; b->slots[k] >= 0; k = (k + 1) & (b->n_slots - 1)) {
        int32_t s = b->slots[k];
        int64_t off = b->set_off[s], len = b->set_off[s + 1] - off;
        if (b->hashes[s] == h && len == n_out && !memcmp(b->pool + off, b->out, (size_t)n_out * sizeof(int32_t)))
            return s;
    }
    int32_t s = b->n_states;
    if (s >= b->max_states) return -3;
    if (s + 1 >= b->cap_states) {
        int64_t cap = (int64_t)b->cap_states * 2;
        b->trans = grow(b->trans, cap * b->n_classes, sizeof(int32_t), &b->failed);
        b->final = grow(b->final, cap, 1, &b->failed);
        b->expanded = grow(b->expanded, cap, 1, &b->failed);
        b->sdist = grow(b->sdist, cap, sizeof(int64_t), &b->failed);
        b->ready = grow(b->ready, cap, sizeof(int32_t), &b->failed);
        b->order = grow(b->order, cap, sizeof(int32_t), &b->failed);
        b->queue = grow(b->queue, cap, sizeof(int32_t), &b->failed);
        b->set_off = grow(b->set_off, cap + 1, sizeof(int64_t), &b->failed);
        b->hashes = grow(b->hashes, cap, sizeof(uint64_t), &b->failed);
        if (b->failed) return -3;
        b->cap_states = (int32_t)cap;
    }
    int64_t off = b->set_off[s];
    if (off + n_out > b->pool_cap) {
        int64_t cap = 2 * (off + n_out);
        b->pool = grow(b->pool, cap, sizeof(int32_t), &b->failed);
        if (b->failed) return -3;
        b->pool_cap = cap;
    }
    memcpy(b->pool + off, b->out, (size_t)n_out * sizeof(int32_t));
    b->set_off[s + 1] = off + n_out;
    b->hashes[s] = h;
    b->slots[k] = s;
    int32_t d = UNREACHED;
    uint8_t fin = 0;
    for (int64_t i = 0; i < n_out; i++) {
        if (b->dist[b->out[i]] < d) d = b->dist[b->out[i]];
        fin |= b->out[i] == b->accept;
    }
    b->sdist[s] = d == UNREACHED ? FAR : d;
    b->final[s] = fin;
    b->expanded[s] = 0;
    b->ready[s] = -1;
    memset(b->trans + (int64_t)s * b->n_classes, 0, (size_t)b->n_classes * sizeof(int32_t));
    b->n_states = s + 1;
    if (2 * b->n_states > b->n_slots && rehash(b)) return -3;
    return s;
}

/* Fill state s's row (once); 0, or -1 where the states or memory ran out. */
int32_t byte_dfa_expand(void *handle, int32_t s) {
    Builder *b = handle;
    if (b->expanded[s]) return 0;
    int64_t off = b->set_off[s], end = b->set_off[s + 1], n_edges = 0;
    for (int64_t i = off; i < end; i++) {
        int32_t u = b->pool[i];
        int64_t need = n_edges + b->edge_ptr[u + 1] - b->edge_ptr[u];
        if (need > b->edge_cap) {
            b->edge_cap = 2 * need;
            b->edges = grow(b->edges, b->edge_cap, sizeof(int32_t), &b->failed);
            b->seeds = grow(b->seeds, b->edge_cap, sizeof(int32_t), &b->failed);
            if (b->failed) return -1;
        }
        for (int32_t k = b->edge_ptr[u]; k < b->edge_ptr[u + 1]; k++) b->edges[n_edges++] = k;
    }
    /* Classes where no edge begins or ends share the row's previous entry. */
    memset(b->changed, 0, (size_t)b->n_classes);
    b->changed[0] = 1;
    for (int64_t i = 0; i < n_edges; i++) {
        int32_t e = b->edges[i];
        b->changed[b->edge_lo[e]] = 1;
        if (b->edge_hi[e] + 1 < b->n_classes) b->changed[b->edge_hi[e] + 1] = 1;
    }
    int32_t prev = 0;
    for (int32_t c = 0; c < b->n_classes; c++) {
        if (b->changed[c]) {
            int32_t n_seeds = 0;
            for (int64_t i = 0; i < n_edges; i++) {
                int32_t e = b->edges[i];
                if (b->edge_lo[e] <= c && c <= b->edge_hi[e]) b->seeds[n_seeds++] = b->edge_to[e];
            }
            prev = n_seeds ? intern_closure(b, n_seeds) : 0;
            if (prev == -3) return -1;
        }
        b->trans[(int64_t)s * b->n_classes + c] = prev;
    }
    b->expanded[s] = 1;
    b->order[b->n_order++] = s;
    return 0;
}

/* Expand every state within `depth` bytes of s (breadth-first, skipping states already known
   to have that many bytes around them expanded); 0, or -1 where the states or memory ran out. */
int32_t byte_dfa_reach(void *handle, int32_t s, int32_t depth) {
    Builder *b = handle;
    if (s == 0 || b->ready[s] >= depth) return 0;
    int32_t head = 0, tail = 0;
    b->ready[s] = depth;
    b->queue[tail++] = s;
    while (head < tail) {
        int32_t t = b->queue[head++], r = b->ready[t];
        if (r == 0) continue;
        if (byte_dfa_expand(b, t)) return -1;
        const int32_t *row = b->trans + (int64_t)t * b->n_classes;
        for (int32_t c = 0; c < b->n_classes; c++) {
            int32_t u = row[c];
            if (u && b->ready[u] < r - 1) {
                b->ready[u] = r - 1;
                b->queue[tail++] = u;
            }
        }
    }
    return 0;
}

/* The state after reading data[0..n) from s (class_of: byte -> class), expanding the states on
   the way; 0 where the walk dies, -1 where the states or memory ran out. */
int32_t byte_dfa_walk(void *handle, int32_t s, const uint8_t *data, int64_t n, const uint8_t *class_of) {
    Builder *b = handle;
    for (int64_t i = 0; i < n && s; i++) {
        if (!b->expanded[s] && byte_dfa_expand(b, s)) return -1;
        s = b->trans[(int64_t)s * b->n_classes + class_of[data[i]]];
    }
    return s;
}

void byte_dfa_free(void *handle) {
    Builder *b = handle;
    if (!b) return;
    free(b->dist), free(b->trans), free(b->final), free(b->sdist), free(b->set_off), free(b->pool);
    free(b->expanded), free(b->ready), free(b->order), free(b->queue);
    free(b->slots), free(b->hashes), free(b->mark), free(b->stack), free(b->out), free(b->seeds);
    free(b->edges), free(b->changed);
    free(b);
}

/* A builder holding the dead state (0) and the start state (1, or none where the language is
   empty); NULL where memory ran out. The NFA arrays must outlive it. */
void *byte_dfa_new(int32_t n_nodes, int32_t start, int32_t accept, int32_t n_classes, const int32_t *eps_ptr,
                   const int32_t *eps_to, const int32_t *edge_ptr, const int32_t *edge_lo, const int32_t *edge_hi,
                   const int32_t *edge_to, int32_t max_states) {
    Builder *b = calloc(1, sizeof(Builder));
    if (!b) return NULL;
    b->n_nodes = n_nodes, b->n_classes = n_classes, b->accept = accept, b->max_states = max_states;
    b->eps_ptr = eps_ptr, b->eps_to = eps_to, b->edge_ptr = edge_ptr;
    b->edge_lo = edge_lo, b->edge_hi = edge_hi, b->edge_to = edge_to;
    b->cap_states = 64, b->n_slots = 256, b->pool_cap = 1024, b->edge_cap = 64;
    b->dist = malloc((size_t)n_nodes * sizeof(int32_t));
    b->trans = malloc((size_t)b->cap_states * (size_t)n_classes * sizeof(int32_t));
    b->final = malloc((size_t)b->cap_states);
    b->sdist = malloc((size_t)b->cap_states * sizeof(int64_t));
    b->expanded = malloc((size_t)b->cap_states);
    b->ready = malloc((size_t)b->cap_states * sizeof(int32_t));
    b->order = malloc((size_t)b->cap_states * sizeof(int32_t));
    b->queue = malloc((size_t)b->cap_states * sizeof(int32_t));
    b->set_off = calloc((size_t)b->cap_states + 1, sizeof(int64_t));
    b->hashes = malloc((size_t)b->cap_states * sizeof(uint64_t));
    b->pool = malloc((size_t)b->pool_cap * sizeof(int32_t));
    b->slots = malloc((size_t)b->n_slots * sizeof(int32_t));
    b->mark = calloc((size_t)n_nodes, sizeof(uint32_t));
    b->stack = malloc((size_t)n_nodes * sizeof(int32_t));
    b->out = malloc((size_t)n_nodes * sizeof(int32_t));
    b->seeds = malloc((size_t)b->edge_cap * sizeof(int32_t));
    b->edges = malloc((size_t)b->edge_cap * sizeof(int32_t));
    b->changed = malloc((size_t)n_classes);
    if (!b->dist || !b->trans || !b->final || !b->sdist || !b->set_off || !b->hashes || !b->pool || !b->slots ||
        !b->expanded || !b->ready || !b->order || !b->queue ||
        !b->mark || !b->stack || !b->out || !b->seeds || !b->edges || !b->changed || nfa_distances(b)) {
        byte_dfa_free(b);
        return NULL;
    }
    memset(b->slots, 0xff, (size_t)b->n_slots * sizeof(int32_t));
    /* the dead state: no nodes, a row of 0s, expanded */
    memset(b->trans, 0, (size_t)n_classes * sizeof(int32_t));
    b->final[0] = 0, b->expanded[0] = 1, b->sdist[0] = FAR, b->ready[0] = INT32_MAX;
    b->set_off[1] = 0, b->hashes[0] = 0, b->n_states = 1;
    b->seeds[0] = start;
    if (intern_closure(b, 1) == -3) {
        byte_dfa_free(b);
        return NULL;
    }
    return b;
}

/* Expand every state (those found on the way included); the state count (the dead state
   included), or -1 where the states or memory ran out. */
int32_t byte_dfa_expand_all(void *handle) {
    Builder *b = handle;
    for (int32_t s = 1; s < b->n_states; s++)
        if (byte_dfa_expand(b, s)) return -1;
    return b->n_states;
}

int32_t byte_dfa_states(void *handle) {
    return ((Builder *)handle)->n_states;
}

/* The states the arrays hold room for: they move only when this grows. */
int32_t byte_dfa_capacity(void *handle) {
    return ((Builder *)handle)->cap_states;
}

/* The builder's arrays, valid while the capacity stays: trans, final, dist, expanded, order
   (n_order entries, returned). */
int32_t byte_dfa_arrays(void *handle, int32_t **trans, uint8_t **final, int64_t **dist, uint8_t **expanded,
                        int32_t **order) {
    Builder *b = handle;
    *trans = b->trans, *final = b->final, *dist = b->sdist, *expanded = b->expanded, *order = b->order;
    return b->n_order;
}

/* The largest finite distance of any NFA node: no DFA state's is larger (a state's is its
   nodes' least). */
int64_t byte_dfa_max_distance(void *handle) {
    Builder *b = handle;
    int64_t out = 0;
    for (int32_t u = 0; u < b->n_nodes; u++)
        if (b->dist[u] != UNREACHED && b->dist[u] > out) out = b->dist[u];
    return out;
}

/* Whether the accepting node can be reached from state s's nodes reading only bytes of the
   classes with ok[c] (the bytes that are tokens by themselves): depth-first over the NFA. */
int32_t byte_dfa_reaches(void *handle, int32_t s, const uint8_t *ok) {
    Builder *b = handle;
    int64_t top = 0;
    if (++b->gen == 0) {
        memset(b->mark, 0, (size_t)b->n_nodes * sizeof(uint32_t));
        b->gen = 1;
    }
    for (int64_t i = b->set_off[s]; i < b->set_off[s + 1]; i++) {
        b->mark[b->pool[i]] = b->gen;
        b->stack[top++] = b->pool[i];
    }
    while (top) {
        int32_t u = b->stack[--top];
        if (u == b->accept) return 1;
        for (int32_t k = b->eps_ptr[u]; k < b->eps_ptr[u + 1]; k++) {
            int32_t v = b->eps_to[k];
            if (b->mark[v] != b->gen) b->mark[v] = b->gen, b->stack[top++] = v;
        }
        for (int32_t k = b->edge_ptr[u]; k < b->edge_ptr[u + 1]; k++) {
            int32_t v = b->edge_to[k], c = b->edge_lo[k];
            while (c <= b->edge_hi[k] && !ok[c]) c++;
            if (c <= b->edge_hi[k] && b->mark[v] != b->gen) b->mark[v] = b->gen, b->stack[top++] = v;
        }
    }
    return 0;
}

/* The fewest bytes from each state of a dense table (trans [n_states, n_classes], final
 * [n_states]) to an accepting state, `unreachable` where none can be reached: breadth-first from
 * the accepting states over the reversed edges. Returns 0, or -1 where memory ran out. */
int32_t table_distances(const int32_t *trans, int32_t n_states, int32_t n_classes, const uint8_t *final,
                        int64_t unreachable, int64_t *dist) {
    int64_t n_edges = (int64_t)n_states * n_classes;
    int32_t *pred_ptr = calloc((size_t)n_states + 1, sizeof(int32_t));
    int32_t *preds = malloc((size_t)(n_edges ? n_edges : 1) * sizeof(int32_t));
    int32_t *queue = malloc((size_t)(n_states ? n_states : 1) * sizeof(int32_t));
    if (!pred_ptr || !preds || !queue) {
        free(pred_ptr); free(preds); free(queue);
        return -1;
    }
    for (int64_t e = 0; e < n_edges; e++) pred_ptr[trans[e] + 1]++;
    for (int32_t s = 0; s < n_states; s++) pred_ptr[s + 1] += pred_ptr[s];
    for (int64_t e = 0; e < n_edges; e++) preds[pred_ptr[trans[e]]++] = (int32_t)(e / n_classes);
    for (int32_t s = n_states; s > 0; s--) pred_ptr[s] = pred_ptr[s - 1]; /* back to each group's start */
    pred_ptr[0] = 0;
    int32_t head = 0, tail = 0;
    for (int32_t s = 0; s < n_states; s++) {
        dist[s] = final[s] ? 0 : unreachable;
        if (final[s]) queue[tail++] = s;
    }
    while (head < tail) {
        int32_t s = queue[head++];
        for (int32_t k = pred_ptr[s]; k < pred_ptr[s + 1]; k++) {
            int32_t p = preds[k];
            if (dist[p] == unreachable) {
                dist[p] = dist[s] + 1;
                queue[tail++] = p;
            }
        }
    }
    free(pred_ptr); free(preds); free(queue);
    return 0;
}
