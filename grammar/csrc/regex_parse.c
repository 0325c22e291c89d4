/* The regex dialect of grammar/regex/nfa.py, parsed from UTF-8 into nfa_build.c's prefix program:
 * literal characters, escapes (\n \t \r \f \v \a, \xNN, \x{N}, \uNNNN, \u{N}, \UNNNNNNNN, escaped
 * ASCII punctuation), `.`, flat character classes (ranges, negation, a leading `]` literal),
 * groups `(...)` and `(?:...)`, alternation, and the greedy quantifiers * + ? {n} {n,} {n,m} {,m}.
 * Anything else (Unicode classes such as \d, anchors, flags, nested classes, class set operations,
 * lazy or possessive quantifiers) is REGEX_UNSUPPORTED: the caller keeps another construction for
 * the same language. An atom's code points go over as the byte-range sequences of their UTF-8
 * encodings, surrogates excluded, each encoding matched by one sequence. */
#include "regex_parse.h"

#include <stdlib.h>
#include <string.h>

#define MAX_CODEPOINT 0x10FFFF
#define SURROGATE_LO 0xD800
#define SURROGATE_HI 0xDFFF
#define MAX_NESTING 1000 /* groups and quantifiers one inside another (the NFA builder recurses on them) */
#define SIZE_CAP ((int64_t)1 << 62)

typedef struct {
    int32_t lo, hi;
} cp_range;

typedef struct {
    cp_range *data;
    int64_t len, cap;
} range_vec;

typedef struct {
    const uint8_t *t;
    int64_t i, end;
    int32_t max_count;
    int status, nesting;
    int64_t error_at;
    const char *reason;
    regex_program *out;
    range_vec ranges, stack; /* an atom's code point ranges; utf8_sequences' work stack */
} parser;

int vec32_reserve(vec32 *v, int64_t n) {
    if (v->len + n <= v->cap) return REGEX_OK;
    int64_t cap = v->cap ? 2 * v->cap : 256;
    while (cap < v->len + n) cap *= 2;
    int32_t *data = realloc(v->data, cap * sizeof(int32_t));
    if (!data) return REGEX_NO_MEMORY;
    v->data = data;
    v->cap = cap;
    return REGEX_OK;
}

int vec32_push(vec32 *v, const int32_t *xs, int64_t n) {
    if (vec32_reserve(v, n)) return REGEX_NO_MEMORY;
    memcpy(v->data + v->len, xs, n * sizeof(int32_t));
    v->len += n;
    return REGEX_OK;
}

static void fail(parser *p, int status, int64_t at, const char *reason) {
    if (p->status) return;
    p->status = status;
    p->error_at = at;
    p->reason = reason;
}

static void push(parser *p, vec32 *v, const int32_t *xs, int64_t n) {
    if (!p->status && vec32_push(v, xs, n)) fail(p, REGEX_NO_MEMORY, p->i, "out of memory");
}

static void push_range(parser *p, range_vec *v, int32_t lo, int32_t hi) {
    if (p->status) return;
    if (v->len == v->cap) {
        int64_t cap = v->cap ? 2 * v->cap : 64;
        cp_range *data = realloc(v->data, cap * sizeof(cp_range));
        if (!data) { fail(p, REGEX_NO_MEMORY, p->i, "out of memory"); return; }
        v->data = data;
        v->cap = cap;
    }
    v->data[v->len++] = (cp_range){lo, hi};
}

static int64_t sat_add(int64_t a, int64_t b) { return a + b > SIZE_CAP ? SIZE_CAP : a + b; }

static int64_t sat_mul(int64_t a, int64_t b) { return b && a > SIZE_CAP / b ? SIZE_CAP : a * b; }

/* --- atoms: code point ranges, then UTF-8 byte-range sequences --- */

static int by_lo(const void *a, const void *b) {
    const cp_range *x = a, *y = b;
    return (x->lo > y->lo) - (x->lo < y->lo);
}

/* The atom's ranges sorted and merged, complemented over 0..MAX_CODEPOINT where negate. */
static void normalize(parser *p, int negate) {
    range_vec *r = &p->ranges;
    qsort(r->data, r->len, sizeof(cp_range), by_lo);
    int64_t n = 0;
    for (int64_t k = 0; k < r->len; k++) {
        if (n && r->data[k].lo <= r->data[n - 1].hi + 1) {
            if (r->data[k].hi > r->data[n - 1].hi) r->data[n - 1].hi = r->data[k].hi;
        } else {
            r->data[n++] = r->data[k];
        }
    }
    r->len = n;
    if (!negate) return;
    p->stack.len = 0;
    int32_t next = 0;
    for (int64_t k = 0; k < n; k++) {
        if (r->data[k].lo > next) push_range(p, &p->stack, next, r->data[k].lo - 1);
        next = r->data[k].hi + 1;
    }
    if (next <= MAX_CODEPOINT) push_range(p, &p->stack, next, MAX_CODEPOINT);
    range_vec swap = p->ranges;
    p->ranges = p->stack;
    p->stack = swap;
}

static int encode(int32_t cp, uint8_t *out) {
    if (cp < 0x80) { out[0] = cp; return 1; }
    if (cp < 0x800) { out[0] = 0xC0 | cp >> 6; out[1] = 0x80 | (cp & 0x3F); return 2; }
    if (cp < 0x10000) {
        out[0] = 0xE0 | cp >> 12; out[1] = 0x80 | (cp >> 6 & 0x3F); out[2] = 0x80 | (cp & 0x3F);
        return 3;
    }
    out[0] = 0xF0 | cp >> 18; out[1] = 0x80 | (cp >> 12 & 0x3F); out[2] = 0x80 | (cp >> 6 & 0x3F);
    out[3] = 0x80 | (cp & 0x3F);
    return 4;
}

/* Appends the atom (p->ranges, normalized) to atoms: its count of sequences, then each as its
 * length and (lo, hi) byte pairs. Ranges are split where the encoding's length changes, around
 * the surrogates, and until each continuation byte spans all of 80-BF or lo and hi share the
 * bytes before it: then one sequence of byte ranges covers the range exactly. */
static void emit_atom(parser *p) {
    regex_program *out = p->out;
    int32_t at = (int32_t)out->atoms.len, zero = 0;
    push(p, &out->atom_ptr, &at, 1);
    push(p, &out->atoms, &zero, 1);
    int32_t nseq = 0;
    range_vec *stack = &p->stack;
    stack->len = 0;
    for (int64_t k = p->ranges.len - 1; k >= 0; k--) push_range(p, stack, p->ranges.data[k].lo, p->ranges.data[k].hi);
    while (stack->len && !p->status) {
        cp_range r = stack->data[--stack->len];
        int32_t lo = r.lo, hi = r.hi;
        if (lo > hi) continue;
        if (lo <= SURROGATE_HI && hi >= SURROGATE_LO) {
            push_range(p, stack, SURROGATE_HI + 1, hi);
            push_range(p, stack, lo, SURROGATE_LO - 1);
            continue;
        }
        static const int32_t splits[3] = {0x7F, 0x7FF, 0xFFFF};
        int split = 0;
        for (int s = 0; s < 3 && !split; s++) {
            if (lo <= splits[s] && splits[s] < hi) {
                push_range(p, stack, splits[s] + 1, hi);
                push_range(p, stack, lo, splits[s]);
                split = 1;
            }
        }
        if (split) continue;
        if (hi > 0x7F) {
            for (int b = 1; b <= 3 && !split; b++) {
                int32_t m = (1 << (6 * b)) - 1;
                if ((lo & ~m) == (hi & ~m)) continue;
                if (lo & m) {
                    push_range(p, stack, (lo | m) + 1, hi);
                    push_range(p, stack, lo, lo | m);
                    split = 1;
                } else if ((hi & m) != m) {
                    push_range(p, stack, hi & ~m, hi);
                    push_range(p, stack, lo, (hi & ~m) - 1);
                    split = 1;
                }
            }
            if (split) continue;
        }
        uint8_t a[4], b[4];
        int32_t n = encode(lo, a), seq[9];
        encode(hi, b);
        seq[0] = n;
        for (int k = 0; k < n; k++) { seq[1 + 2 * k] = a[k]; seq[2 + 2 * k] = b[k]; }
        push(p, &out->atoms, seq, 1 + 2 * n);
        nseq++;
    }
    if (!p->status) out->atoms.data[at] = nseq;
    int32_t header[4] = {OP_ATOM, (int32_t)out->atom_ptr.len - 1, 0, 4};
    push(p, &out->prog, header, 4);
}

/* --- the syntax --- */

static int is_hex(uint8_t c) { return (c >= '0' && c <= '9') || ((c | 0x20) >= 'a' && (c | 0x20) <= 'f'); }

static int hex_value(uint8_t c) { return c <= '9' ? c - '0' : (c | 0x20) - 'a' + 10; }

/* The code point of the UTF-8 character at t[*i] (the text is valid UTF-8), *i moved past it. */
static int32_t decode(parser *p, int64_t *i) {
    uint8_t c = p->t[*i];
    int n = c < 0x80 ? 1 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4;
    if (*i + n > p->end) {
        fail(p, REGEX_UNSUPPORTED, *i, "a truncated UTF-8 character");
        *i = p->end;
        return 0;
    }
    int32_t cp = n == 1 ? c : n == 2 ? c & 0x1F : n == 3 ? c & 0x0F : c & 0x07;
    for (int k = 1; k < n; k++) cp = cp << 6 | (p->t[*i + k] & 0x3F);
    *i += n;
    return cp;
}

/* Python's str.isspace over ASCII: what an escape may not make literal. */
static int is_ascii_space(uint8_t c) { return c == ' ' || (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x1F); }

static int is_ascii_alnum(uint8_t c) {
    return (c >= '0' && c <= '9') || ((c | 0x20) >= 'a' && (c | 0x20) <= 'z');
}

/* The code point of the escape at t[i] (a backslash) that ends before `limit`; *next past it. */
static int32_t escape(parser *p, int64_t i, int64_t limit, int64_t *next) {
    const uint8_t *t = p->t;
    *next = limit;
    if (i + 1 >= limit) { fail(p, REGEX_UNSUPPORTED, i, "a trailing backslash"); return 0; }
    uint8_t c = t[i + 1];
    if (c == 'x' || c == 'u' || c == 'U') {
        int64_t lo = i + 2, hi;
        if (lo < limit && t[lo] == '{') {
            hi = ++lo;
            while (hi < limit && t[hi] != '}') hi++;
            if (hi >= limit) { fail(p, REGEX_UNSUPPORTED, i, "an escape not closed"); return 0; }
            *next = hi + 1;
        } else {
            hi = lo + (c == 'x' ? 2 : c == 'u' ? 4 : 8);
            if (hi > limit) { fail(p, REGEX_UNSUPPORTED, i, "a short hexadecimal escape"); return 0; }
            *next = hi;
        }
        int64_t cp = 0;
        for (int64_t k = lo; k < hi; k++) {
            if (!is_hex(t[k])) { fail(p, REGEX_UNSUPPORTED, i, "a hexadecimal escape with other characters"); return 0; }
            cp = cp > MAX_CODEPOINT ? cp : cp * 16 + hex_value(t[k]);
        }
        if (hi == lo || cp > MAX_CODEPOINT || (cp >= SURROGATE_LO && cp <= SURROGATE_HI)) {
            fail(p, REGEX_UNSUPPORTED, i, "an escape that is no Unicode scalar value");
            return 0;
        }
        return (int32_t)cp;
    }
    *next = i + 2;
    switch (c) {
    case 'n': return 0x0A;
    case 't': return 0x09;
    case 'r': return 0x0D;
    case 'f': return 0x0C;
    case 'v': return 0x0B;
    case 'a': return 0x07;
    }
    if (c < 0x80 && !is_ascii_alnum(c) && !is_ascii_space(c)) return c;
    fail(p, REGEX_UNSUPPORTED, i, "an escape of a class or an assertion (\\d, \\w, \\p, \\b, ...)");
    return 0;
}

/* A class character at t[k] (of a body ending before `limit`); *next past it. */
static int32_t class_char(parser *p, int64_t k, int64_t limit, int first, int64_t *next) {
    uint8_t c = p->t[k];
    if (c == '\\') return escape(p, k, limit, next);
    if (c == '[' || (c == ']' && !first)) { fail(p, REGEX_UNSUPPORTED, k, "a nested class"); *next = limit; return 0; }
    *next = k;
    return decode(p, next);
}

static int contains_pair(const uint8_t *t, int64_t lo, int64_t hi, uint8_t c) {
    for (int64_t k = lo; k + 1 < hi; k++)
        if (t[k] == c && t[k + 1] == c) return 1;
    return 0;
}

static void char_class(parser *p) {
    const uint8_t *t = p->t;
    int64_t start = p->i, j = start + 1;
    j += j < p->end && t[j] == '^';
    j += j < p->end && t[j] == ']';
    int depth = 1;
    while (j < p->end && depth) {
        if (t[j] == '\\') j++;
        else if (t[j] == '[') depth++;
        else if (t[j] == ']') depth--;
        j++;
    }
    if (depth || j > p->end) { fail(p, REGEX_UNSUPPORTED, start, "a class not closed"); return; }
    int64_t lo = start + 1, hi = j - 1;
    int negate = lo < hi && t[lo] == '^';
    lo += negate;
    if (contains_pair(t, lo, hi, '&') || contains_pair(t, lo, hi, '-') || contains_pair(t, lo, hi, '~')) {
        fail(p, REGEX_UNSUPPORTED, start, "class set operations");
        return;
    }
    p->ranges.len = 0;
    for (int64_t k = lo; k < hi && !p->status;) {
        int64_t next;
        int32_t first = class_char(p, k, hi, k == lo, &next), last = first;
        k = next;
        if (k + 1 < hi && t[k] == '-') {
            last = class_char(p, k + 1, hi, 0, &next);
            k = next;
            if (last < first) fail(p, REGEX_UNSUPPORTED, start, "a reversed class range");
        }
        push_range(p, &p->ranges, first, last);
    }
    p->i = j;
    if (p->status) return;
    normalize(p, negate);
    emit_atom(p);
}

static void single(parser *p, int32_t lo, int32_t hi, int negate) {
    p->ranges.len = 0;
    push_range(p, &p->ranges, lo, hi);
    normalize(p, negate);
    emit_atom(p);
}

static int64_t alternation(parser *p, int32_t *options);

/* One atom (a group counts as one) at p->i; its size. */
static int64_t atom(parser *p) {
    const uint8_t *t = p->t;
    int64_t i = p->i;
    uint8_t c = t[i];
    if (c == '(') {
        int64_t inner = i + 1;
        if (inner < p->end && t[inner] == '?') {
            if (inner + 1 < p->end && t[inner + 1] == ':') inner += 2;
            else { fail(p, REGEX_UNSUPPORTED, i, "a flag or named group"); return 0; }
        }
        if (++p->nesting > MAX_NESTING) { fail(p, REGEX_UNSUPPORTED, i, "groups nested too deep"); return 0; }
        p->i = inner;
        int32_t options;
        int64_t size = alternation(p, &options);
        p->nesting--;
        if (p->status) return 0;
        if (p->i >= p->end || t[p->i] != ')') { fail(p, REGEX_UNSUPPORTED, i, "a group not closed"); return 0; }
        p->i++;
        return size;
    }
    if (c == '[') {
        char_class(p);
        return 1;
    }
    if (c == '\\') {
        int32_t cp = escape(p, i, p->end, &p->i);
        if (!p->status) single(p, cp, cp, 0);
        return 1;
    }
    if (c == '.') {
        p->i++;
        single(p, 0x0A, 0x0A, 1);
        return 1;
    }
    if (c == '*' || c == '+' || c == '?' || c == '{') {
        fail(p, REGEX_UNSUPPORTED, i, "a quantifier without an operand");
        return 0;
    }
    if (c == '^' || c == '$') { fail(p, REGEX_UNSUPPORTED, i, "an anchor"); return 0; }
    int32_t cp = decode(p, &p->i);
    if (cp == 0xE000 || cp == 0xE002) { fail(p, REGEX_UNSUPPORTED, i, "a rule placeholder"); return 0; }
    single(p, cp, cp, 0);
    return 1;
}

/* A decimal count at t[*k]; -1 where there is none; *k moved past its digits. */
static int64_t count(parser *p, int64_t *k) {
    int64_t n = -1;
    while (*k < p->end && p->t[*k] >= '0' && p->t[*k] <= '9') {
        n = (n < 0 ? 0 : n) * 10 + (p->t[*k] - '0');
        if (n > p->max_count) n = (int64_t)p->max_count + 1;
        ++*k;
    }
    return n;
}

/* The quantifiers after the node at prog[at..] (whose size is `size`): each wraps it in a REPEAT. */
static int64_t quantified(parser *p, int64_t at, int64_t size) {
    const uint8_t *t = p->t;
    int nested = 0;
    while (!p->status && p->i < p->end) {
        uint8_t c = t[p->i];
        int64_t lo, hi, start = p->i;
        if (c == '*') lo = 0, hi = -1;
        else if (c == '+') lo = 1, hi = -1;
        else if (c == '?') lo = 0, hi = 1;
        else if (c == '{') {
            int64_t k = p->i + 1;
            lo = count(p, &k);
            hi = lo;
            if (k < p->end && t[k] == ',') {
                k++;
                hi = count(p, &k);
            } else if (lo < 0) {
                fail(p, REGEX_UNSUPPORTED, start, "a repetition without a count");
                break;
            }
            if (k >= p->end || t[k] != '}') { fail(p, REGEX_UNSUPPORTED, start, "a malformed repetition"); break; }
            lo = lo < 0 ? 0 : lo;
            p->i = k;
            if (lo > p->max_count || hi > p->max_count) { fail(p, REGEX_TOO_LARGE, start, "a repetition count too large"); break; }
            if (hi >= 0 && hi < lo) { fail(p, REGEX_UNSUPPORTED, start, "a repetition whose bounds are reversed"); break; }
        } else break;
        p->i++;
        if (p->i < p->end && (t[p->i] == '?' || t[p->i] == '+')) {
            fail(p, REGEX_UNSUPPORTED, p->i, "a lazy or possessive quantifier");
            break;
        }
        if (p->nesting + ++nested > MAX_NESTING) { fail(p, REGEX_UNSUPPORTED, start, "quantifiers nested too deep"); break; }
        vec32 *prog = &p->out->prog;
        int32_t pad[4] = {0, 0, 0, 0};
        push(p, prog, pad, 4);
        if (p->status) break;
        memmove(prog->data + at + 4, prog->data + at, (prog->len - 4 - at) * sizeof(int32_t));
        int32_t header[4] = {OP_REPEAT, (int32_t)lo, (int32_t)hi, (int32_t)(prog->len - at)};
        memcpy(prog->data + at, header, sizeof header);
        size = sat_mul(size, (hi < 0 ? lo : hi) > 1 ? (hi < 0 ? lo : hi) : 1);
    }
    return size;
}

static int64_t sequence(parser *p) {
    vec32 *prog = &p->out->prog;
    int64_t at = prog->len, size = 0;
    int32_t header[4] = {OP_SEQ, 0, 0, 0}, n = 0;
    push(p, prog, header, 4);
    while (!p->status && p->i < p->end && p->t[p->i] != '|' && p->t[p->i] != ')') {
        int64_t item = prog->len;
        size = sat_add(size, quantified(p, item, atom(p)));
        n++;
    }
    if (p->status) return 0;
    prog->data[at + 1] = n;
    prog->data[at + 3] = (int32_t)(prog->len - at);
    return size;
}

/* Options separated by `|` up to a `)` or the end; one option is its sequence alone. */
static int64_t alternation(parser *p, int32_t *options) {
    vec32 *prog = &p->out->prog;
    int64_t at = prog->len, size = 0;
    int32_t header[4] = {OP_ALT, 0, 0, 0}, n = 0;
    push(p, prog, header, 4);
    for (;;) {
        size = sat_add(size, sequence(p));
        n++;
        if (p->status || p->i >= p->end || p->t[p->i] != '|') break;
        p->i++;
    }
    *options = n;
    if (p->status) return 0;
    if (n == 1) {
        memmove(prog->data + at, prog->data + at + 4, (prog->len - at - 4) * sizeof(int32_t));
        prog->len -= 4;
    } else {
        prog->data[at + 1] = n;
        prog->data[at + 3] = (int32_t)(prog->len - at);
    }
    return size;
}

static int ends_in_anchor(const uint8_t *t, int64_t len) {
    if (len < 2 || t[len - 1] != 'z' || t[len - 2] != '\\') return 0;
    int64_t slashes = 0;
    for (int64_t k = len - 2; k >= 0 && t[k] == '\\'; k--) slashes++;
    return slashes % 2 == 1;
}

int regex_parse(const uint8_t *text, int64_t len, int32_t max_count, int anchored, regex_program *out,
                int64_t *error_at, const char **reason) {
    memset(out, 0, sizeof *out);
    parser p = {.t = text, .end = len, .max_count = max_count, .out = out};
    if (anchored) {
        if (!ends_in_anchor(text, len)) fail(&p, REGEX_UNSUPPORTED, len, "a pattern not anchored at its end");
        p.end = len - 2;
    }
    int32_t options = 1;
    if (!p.status) out->size = alternation(&p, &options);
    if (!p.status && p.i != p.end) fail(&p, REGEX_UNSUPPORTED, p.i, "an unbalanced ')'");
    if (!p.status && anchored && options > 1) fail(&p, REGEX_UNSUPPORTED, 0, "an alternation around the end anchor");
    free(p.ranges.data);
    free(p.stack.data);
    *error_at = p.error_at;
    *reason = p.reason;
    return p.status;
}

/* The expanded size of text[0..len) (regex.tree's size: atoms with every bounded repetition
 * written out, saturating at 2^62), or -1 where regex_parse does not read it. */
int64_t regex_expanded_size(const uint8_t *text, int64_t len) {
    regex_program rp;
    int64_t error_at;
    const char *reason;
    int status = regex_parse(text, len, INT32_MAX, 0, &rp, &error_at, &reason);
    int64_t size = status ? -1 : rp.size;
    regex_program_free(&rp);
    return size;
}

void regex_program_free(regex_program *p) {
    free(p->prog.data);
    free(p->atom_ptr.data);
    free(p->atoms.data);
    memset(p, 0, sizeof *p);
}
