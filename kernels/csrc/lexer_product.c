/* The contextual lexer's product DFA (grammar/lexer_product.py): from one candidate set's start,
   breadth first over the states where two or more terminals are still alive. */
#include <stdint.h>
#include <string.h>

static uint64_t members_hash(const int32_t *ids, int32_t n) {
    uint64_t h = 1469598103934665603ull;  /* FNV-1a */
    for (int32_t i = 0; i < n; i++) h = (h ^ (uint32_t)ids[i]) * 1099511628211ull;
    return h;
}

/* The lexer's table trans ([states, n_classes], `dead` where the lexeme dies) holds each
   terminal's own states, accept[id] the terminal a state completes (-1 none); rank[t] orders
   the terminals that complete at once. A product state is the ascending list of the terminals'
   own states still alive (one per terminal), members[ptr[i]:ptr[i+1]]; state 0 is `start` (k
   ids). Writes per state best[i] (the completed terminal of lowest rank, -1 none), n_final[i],
   and rows[i][c]: the next own state where one terminal stays alive, -1 where none does,
   -2 - (the next product state) where two or more do. `table` (table_mask + 1 entries, at least
   2 * cap_states) finds states already listed; state 0 is not in it (a start has no way back
   in). `next` holds k ids. Returns the number of states, or -1 / -2 when cap_states /
   cap_members are too small. */
int64_t lexer_product(int32_t k, const int32_t *start, const int32_t *trans, int32_t n_classes,
                      int32_t dead, const int32_t *accept, const int64_t *rank, int32_t cap_states,
                      int32_t cap_members, int32_t *ptr, int32_t *members, int64_t *rows,
                      int32_t *best, int32_t *n_final, int32_t *table, int32_t table_mask,
                      int32_t *next) {
    if (cap_states < 1) return -1;
    if (cap_members < k) return -2;
    memset(table, 0xff, ((size_t)table_mask + 1) * sizeof(int32_t));
    memcpy(members, start, k * sizeof(int32_t));
    int32_t n = 1, m = k;
    ptr[0] = 0;
    ptr[1] = m;
    for (int32_t i = 0; i < n; i++) {
        int32_t lo = ptr[i], hi = ptr[i + 1], b = -1, f = 0;
        for (int32_t x = lo; x < hi; x++) {
            int32_t t = accept[members[x]];
            if (t >= 0) {
                f++;
                if (b < 0 || rank[t] < rank[b]) b = t;
            }
        }
        best[i] = b;
        n_final[i] = f;
        for (int32_t c = 0; c < n_classes; c++) {
            int32_t cnt = 0;
            for (int32_t x = lo; x < hi; x++) {
                int32_t s = trans[(int64_t)members[x] * n_classes + c];
                if (s != dead) next[cnt++] = s;
            }
            int64_t *row = rows + (int64_t)i * n_classes + c;
            if (cnt < 2) {
                *row = cnt ? next[0] : -1;
                continue;
            }
            int32_t slot = (int32_t)(members_hash(next, cnt) & (uint64_t)table_mask), found = -1;
            for (; table[slot] >= 0; slot = (slot + 1) & table_mask) {
                int32_t o = table[slot];
                if (ptr[o + 1] - ptr[o] == cnt && !memcmp(members + ptr[o], next, cnt * sizeof(int32_t))) {
                    found = o;
                    break;
                }
            }
            if (found < 0) {
                if (n == cap_states) return -1;
                if (m + cnt > cap_members) return -2;
                memcpy(members + m, next, cnt * sizeof(int32_t));
                m += cnt;
                found = n++;
                ptr[n] = m;
                table[slot] = found;
            }
            *row = -2 - found;
        }
    }
    return n;
}
