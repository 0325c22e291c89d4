/* The contextual lexer's product DFA (grammar/cfg/lexer_product.py): from one candidate set's start,
   breadth first over the states where two or more terminals are still alive. */
#include <stdint.h>
#include <string.h>

static uint64_t members_hash(const int32_t *ids, int32_t n) {
    uint64_t h = 1469598103934665603ull;  /* FNV-1a */
    for (int32_t i = 0; i < n; i++) h = (h ^ (uint32_t)ids[i]) * 1099511628211ull;
    return h;
}

/* Looks `ids` (n) up in the known states (k_table: entry indices by hash, -1 empty); -1 if not. */
static int32_t known_find(const int32_t *ids, int32_t n, uint64_t h, const int32_t *k_table, int32_t k_mask,
                          const int64_t *k_off, const int32_t *k_len, const int32_t *k_members) {
    for (int32_t slot = (int32_t)(h & (uint64_t)k_mask); k_table[slot] >= 0; slot = (slot + 1) & k_mask) {
        int32_t e = k_table[slot];
        if (k_len[e] == n && !memcmp(k_members + k_off[e], ids, n * sizeof(int32_t))) return e;
    }
    return -1;
}

static void known_insert(int32_t e, uint64_t h, int32_t *k_table, int32_t k_mask) {
    int32_t slot = (int32_t)(h & (uint64_t)k_mask);
    while (k_table[slot] >= 0) slot = (slot + 1) & k_mask;
    k_table[slot] = e;
}

/* Rebuilds the known states' table (k_mask + 1 slots) after it grew. */
void lexer_product_rehash(int32_t *k_table, int32_t k_mask, const int64_t *k_off, const int32_t *k_len,
                          const int32_t *k_members, int64_t n_entries) {
    memset(k_table, 0xff, ((size_t)k_mask + 1) * sizeof(int32_t));
    for (int32_t e = 0; e < n_entries; e++)
        known_insert(e, members_hash(k_members + k_off[e], k_len[e]), k_table, k_mask);
}

/* The lexer's table trans ([states, n_classes], `dead` where the lexeme dies) holds each
   terminal's own states, accept[id] the terminal a state completes (-1 none); rank[t] orders
   the terminals that complete at once. A product state is the ascending list of the terminals'
   own states still alive (one per terminal). Lists, breadth first from `start` (k ids, state
   0), the product states not known yet (the known ones, with their lexer ids, are in k_*:
   k_count[0] entries, entry e's members k_members[k_off[e]:][:k_len[e]], its id k_id[e]; their
   rows are in the table already), state i to get lexer id first_id + i: members[ptr[i]:ptr[i+1]],
   best[i] (the completed terminal of lowest rank, -1 none), n_final[i], and rows[i][c] (the next
   lexer id, -1 where the lexeme dies). `table` (table_mask + 1 entries, at least 2 * cap_states)
   finds the states listed by this walk; state 0 is in neither table (a start has no way back
   in). `next` holds k ids. Returns the number of states, having added all but the start to the
   known ones, or -1 / -2 when cap_states / cap_members are too small, -3 when the known ones'
   arrays are (nothing added). */
int64_t lexer_product(int32_t k, const int32_t *start, const int32_t *trans, int32_t n_classes,
                      int32_t dead, const int32_t *accept, const int64_t *rank, int32_t first_id,
                      int32_t cap_states, int32_t cap_members, int32_t *ptr, int32_t *members, int64_t *rows,
                      int32_t *best, int32_t *n_final, int32_t *table, int32_t table_mask, int32_t *next,
                      int32_t *k_table, int32_t k_mask, int64_t *k_off, int32_t *k_len, int32_t *k_id,
                      int32_t *k_members, int64_t *k_count, int64_t k_cap_entries, int64_t k_cap_members) {
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
            uint64_t h = members_hash(next, cnt);
            int32_t e = known_find(next, cnt, h, k_table, k_mask, k_off, k_len, k_members);
            if (e >= 0) {
                *row = k_id[e];
                continue;
            }
            int32_t slot = (int32_t)(h & (uint64_t)table_mask), found = -1;
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
            *row = (int64_t)first_id + found;
        }
    }
    int64_t entries = k_count[0], used = k_count[1];
    if (entries + n - 1 > k_cap_entries || 2 * (entries + n - 1) > (int64_t)k_mask + 1
            || used + (m - k) > k_cap_members)
        return -3;
    for (int32_t i = 1; i < n; i++, entries++) {
        int32_t len = ptr[i + 1] - ptr[i];
        memcpy(k_members + used, members + ptr[i], len * sizeof(int32_t));
        k_off[entries] = used;
        k_len[entries] = len;
        k_id[entries] = first_id + i;
        known_insert((int32_t)entries, members_hash(members + ptr[i], len), k_table, k_mask);
        used += len;
    }
    k_count[0] = entries;
    k_count[1] = used;
    return n;
}

/* One terminal's own states as the lexer's rows from `base` on (rows [n_states, n_joint] of its
   table, accept and is_final from `base` too): each joint class read through `joint` (the
   terminal's class per joint class, trans [n_states, n_classes] its DFA); an entry that dies
   (term_dead), and every entry of an accepting state of a lazy terminal (it ends at its first
   match), is table_dead. */
void lexer_own_rows(const int32_t *trans, int32_t n_states, int32_t n_classes, const uint8_t *final,
                    int32_t term_dead, int32_t lazy, const int64_t *joint, int32_t n_joint, int32_t base,
                    int32_t table_dead, int32_t term, int32_t *rows, int32_t *accept, uint8_t *is_final) {
    for (int32_t s = 0; s < n_states; s++) {
        const int32_t *row = trans + (int64_t)s * n_classes;
        int32_t *out = rows + (int64_t)s * n_joint;
        if (final[s] && lazy) {
            for (int32_t j = 0; j < n_joint; j++) out[j] = table_dead;
        } else {
            for (int32_t j = 0; j < n_joint; j++) {
                int32_t next = row[joint[j]];
                out[j] = next == term_dead ? table_dead : next + base;
            }
        }
        accept[s] = final[s] ? term : -1;
        is_final[s] = final[s];
    }
}
