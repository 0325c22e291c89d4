/* Thompson's construction of a regex's byte NFA from its parse (regex_parse.c), with bounded
 * repetitions written out here: the parse is a prefix program of int32, each node a header (op, x,
 * y, its length in the program with its children) and its children:
 *   ATOM a 0          the atom's UTF-8 byte-range sequences (atoms[atom_ptr[a]..])
 *   SEQ n 0 <n nodes>   ALT n 0 <n nodes>   REPEAT lo hi <node>   (hi -1: unbounded)
 * and an atom as: nseq, then per sequence its length and (lo, hi) byte pairs.
 * The result: num_nodes, epsilon edges (src, dst) and byte edges (src, lo, hi, dst), the graph
 * tests/grammar/regex/nfa_oracle.py's Python construction builds (its node numbers may differ). */
#include <stdint.h>
#include <stdlib.h>

#include "regex_parse.h"

typedef struct {
    const int32_t *prog, *atom_ptr, *atoms;
    int32_t max_nodes, num_nodes;
    int status;
    vec32 eps, edges, suffix; /* suffix: an atom's shared tails, (lo, hi, to, node) */
    /* Each atom's nodes and edges as built the first time, numbered from its first node (-1:
       the node it starts from), then copied: [nodes, edges, (src, lo, hi, dst) per edge]. */
    vec32 templates;
    int32_t *template_at; /* per atom: its template's offset in templates, -1 until built */
} nfa_builder;

static void push(nfa_builder *b, vec32 *v, const int32_t *xs, int n) {
    if (!b->status && vec32_push(v, xs, n)) b->status = REGEX_NO_MEMORY;
}

static int32_t new_node(nfa_builder *b) {
    if (b->num_nodes >= b->max_nodes) { b->status = REGEX_TOO_LARGE; return 0; }
    return b->num_nodes++;
}

static void eps(nfa_builder *b, int32_t src, int32_t dst) {
    int32_t e[2] = {src, dst};
    push(b, &b->eps, e, 2);
}

static void edge(nfa_builder *b, int32_t src, int32_t lo, int32_t hi, int32_t dst) {
    int32_t e[4] = {src, lo, hi, dst};
    push(b, &b->edges, e, 4);
}

/* The atom's sequences from `start`; common suffixes lead to shared nodes, so the bytes left of
 * a character reach one node whatever its first bytes were. */
static int32_t build_atom(nfa_builder *b, int32_t a, int32_t start) {
    const int32_t *p = b->atoms + b->atom_ptr[a];
    int32_t end = new_node(b), nseq = *p++;
    b->suffix.len = 0;
    for (int32_t s = 0; s < nseq && !b->status; s++) {
        int32_t len = *p++, at = end;
        for (int32_t k = len - 1; k >= 1; k--) {
            int32_t lo = p[2 * k], hi = p[2 * k + 1], node = -1;
            for (int64_t j = 0; j < b->suffix.len; j += 4) {
                const int32_t *t = b->suffix.data + j;
                if (t[0] == lo && t[1] == hi && t[2] == at) { node = t[3]; break; }
            }
            if (node < 0) {
                node = new_node(b);
                int32_t t[4] = {lo, hi, at, node};
                push(b, &b->suffix, t, 4);
                edge(b, node, lo, hi, at);
            }
            at = node;
        }
        edge(b, start, p[0], p[1], at);
        p += 2 * len;
    }
    return end;
}

/* An atom's fragment: built once, then copied from its template (the same nodes and edges, in
 * the same order, as building it again). */
static int32_t atom(nfa_builder *b, int32_t a, int32_t start) {
    int32_t base = b->num_nodes;
    if (b->template_at[a] < 0) {
        int64_t first_edge = b->edges.len;
        int32_t end = build_atom(b, a, start);
        if (b->status) return 0;
        int32_t header[2] = {b->num_nodes - base, (int32_t)((b->edges.len - first_edge) / 4)};
        b->template_at[a] = (int32_t)b->templates.len;
        push(b, &b->templates, header, 2);
        for (int64_t e = first_edge; e < b->edges.len && !b->status; e += 4) {
            const int32_t *x = b->edges.data + e;
            int32_t rel[4] = {x[0] == start ? -1 : x[0] - base, x[1], x[2], x[3] - base};
            push(b, &b->templates, rel, 4);
        }
        return end;
    }
    const int32_t *t = b->templates.data + b->template_at[a];
    int32_t nodes = t[0], n_edges = t[1];
    if (b->num_nodes > b->max_nodes - nodes) { b->status = REGEX_TOO_LARGE; return 0; }
    b->num_nodes += nodes;
    if (vec32_reserve(&b->edges, 4 * (int64_t)n_edges)) { b->status = REGEX_NO_MEMORY; return 0; }
    int32_t *out = b->edges.data + b->edges.len;
    for (int32_t e = 0; e < n_edges; e++) {
        const int32_t *x = t + 2 + 4 * e;
        out[4 * e] = x[0] < 0 ? start : base + x[0];
        out[4 * e + 1] = x[1];
        out[4 * e + 2] = x[2];
        out[4 * e + 3] = base + x[3];
    }
    b->edges.len += 4 * (int64_t)n_edges;
    return base; /* the atom's end is its first node */
}

static int64_t skip(const int32_t *prog, int64_t pc) { return pc + prog[pc + 3]; }

static int32_t build(nfa_builder *b, int64_t pc, int32_t start);

static int32_t repeat(nfa_builder *b, int64_t pc, int32_t start) {
    int32_t lo = b->prog[pc + 1], hi = b->prog[pc + 2];
    int64_t item = pc + 4;
    int32_t copies = (hi >= 0 || lo == 0) ? lo : lo - 1;
    for (int32_t i = 0; i < copies && !b->status; i++) start = build(b, item, start);
    if (hi < 0) { /* a loop on a fresh entry, so nothing else shares its back edge */
        int32_t head = new_node(b);
        eps(b, start, head);
        int32_t tail = build(b, item, head);
        eps(b, tail, head);
        if (lo == 0) return head;
        int32_t end = new_node(b);
        eps(b, tail, end);
        return end;
    }
    int32_t end = new_node(b);
    for (int32_t i = 0; i < hi - lo && !b->status; i++) {
        eps(b, start, end);
        start = build(b, item, start);
    }
    eps(b, start, end);
    return end;
}

static int32_t build(nfa_builder *b, int64_t pc, int32_t start) {
    if (b->status) return 0;
    const int32_t *prog = b->prog;
    switch (prog[pc]) {
    case OP_ATOM: return atom(b, prog[pc + 1], start);
    case OP_REPEAT: return repeat(b, pc, start);
    case OP_SEQ: {
        int32_t n = prog[pc + 1];
        pc += 4;
        for (int32_t i = 0; i < n && !b->status; i++) {
            start = build(b, pc, start);
            pc = skip(prog, pc);
        }
        return start;
    }
    default: { /* OP_ALT */
        int32_t n = prog[pc + 1], end = new_node(b);
        pc += 4;
        for (int32_t i = 0; i < n && !b->status; i++) {
            eps(b, build(b, pc, start), end);
            pc = skip(prog, pc);
        }
        return end;
    }
    }
}

/* Parses text[0..len) (UTF-8, ending in `\z`: see regex_parse) and builds its NFA (start node 0);
 * returns a handle for nfa_result / nfa_free, or NULL where the parse failed (*status: its
 * REGEX_* code, *error_at and *reason where REGEX_UNSUPPORTED) or memory ran out before any.
 * *status: REGEX_OK, REGEX_NO_MEMORY or REGEX_TOO_LARGE (past max_nodes) otherwise. */
void *nfa_build_regex(const uint8_t *text, int64_t len, int32_t max_nodes, int32_t *status, int32_t *accept,
                      int64_t *error_at, const char **reason) {
    regex_program rp;
    *status = regex_parse(text, len, max_nodes, 1, &rp, error_at, reason);
    nfa_builder *b = *status ? NULL : calloc(1, sizeof(nfa_builder));
    if (!b) {
        regex_program_free(&rp);
        if (!*status) *status = REGEX_NO_MEMORY;
        return NULL;
    }
    b->prog = rp.prog.data;
    b->atom_ptr = rp.atom_ptr.data;
    b->atoms = rp.atoms.data;
    b->max_nodes = max_nodes;
    b->template_at = malloc((rp.atom_ptr.len ? rp.atom_ptr.len : 1) * sizeof(int32_t));
    if (!b->template_at) {
        regex_program_free(&rp);
        *status = REGEX_NO_MEMORY;
        return b;
    }
    for (int64_t a = 0; a < rp.atom_ptr.len; a++) b->template_at[a] = -1;
    int32_t start = new_node(b);
    *accept = build(b, 0, start);
    *status = b->status;
    regex_program_free(&rp);
    return b;
}

/* The built NFA's node count; its edges through the pointers (valid until nfa_free). */
int32_t nfa_result(void *handle, const int32_t **eps_out, int64_t *num_eps, const int32_t **edges_out,
                   int64_t *num_edges) {
    nfa_builder *b = handle;
    *eps_out = b->eps.data;
    *num_eps = b->eps.len / 2;
    *edges_out = b->edges.data;
    *num_edges = b->edges.len / 4;
    return b->num_nodes;
}

/* The built NFA in ByteNFA's form, into the caller's arrays: class_of [256] (bytes grouped where
 * no edge tells them apart), epsilon and byte edges grouped by source in insertion order
 * (eps_ptr, edge_ptr [num_nodes + 1]), byte edges' ranges as classes. */
void nfa_csr(void *handle, uint8_t *class_of, int32_t *eps_ptr, int32_t *eps_to, int32_t *edge_ptr,
             int32_t *edge_lo, int32_t *edge_hi, int32_t *edge_to) {
    nfa_builder *b = handle;
    int32_t n = b->num_nodes;
    int64_t num_eps = b->eps.len / 2, num_edges = b->edges.len / 4;
    const int32_t *eps = b->eps.data, *edges = b->edges.data;
    uint8_t starts[257] = {0};
    starts[0] = starts[256] = 1;
    for (int64_t i = 0; i < num_edges; i++) starts[edges[4 * i + 1]] = starts[edges[4 * i + 2] + 1] = 1;
    int32_t cls = -1;
    for (int c = 0; c < 256; c++) class_of[c] = (uint8_t)(cls += starts[c]);
    for (int32_t v = 0; v <= n; v++) eps_ptr[v] = edge_ptr[v] = 0;
    for (int64_t i = 0; i < num_eps; i++) eps_ptr[eps[2 * i] + 1]++;
    for (int64_t i = 0; i < num_edges; i++) edge_ptr[edges[4 * i] + 1]++;
    for (int32_t v = 0; v < n; v++) {
        eps_ptr[v + 1] += eps_ptr[v];
        edge_ptr[v + 1] += edge_ptr[v];
    }
    for (int64_t i = 0; i < num_eps; i++) eps_to[eps_ptr[eps[2 * i]]++] = eps[2 * i + 1];
    for (int64_t i = 0; i < num_edges; i++) {
        int32_t at = edge_ptr[edges[4 * i]]++;
        edge_lo[at] = class_of[edges[4 * i + 1]];
        edge_hi[at] = class_of[edges[4 * i + 2]];
        edge_to[at] = edges[4 * i + 3];
    }
    for (int32_t v = n; v > 0; v--) { /* each pointer moved to its group's end: shift back */
        eps_ptr[v] = eps_ptr[v - 1];
        edge_ptr[v] = edge_ptr[v - 1];
    }
    eps_ptr[0] = edge_ptr[0] = 0;
}

void nfa_free(void *handle) {
    nfa_builder *b = handle;
    if (!b) return;
    free(b->eps.data);
    free(b->edges.data);
    free(b->suffix.data);
    free(b->templates.data);
    free(b->template_at);
    free(b);
}
