/* A regex parsed into nfa_build.c's prefix program (regex_parse.c). */
#ifndef GDSERVE_REGEX_PARSE_H
#define GDSERVE_REGEX_PARSE_H
#include <stdint.h>

enum { OP_ATOM = 0, OP_SEQ = 1, OP_ALT = 2, OP_REPEAT = 3 };
enum { REGEX_OK = 0, REGEX_NO_MEMORY = -1, REGEX_TOO_LARGE = -2, REGEX_UNSUPPORTED = -3 };

typedef struct {
    int32_t *data;
    int64_t len, cap;
} vec32;

/* 0, or REGEX_NO_MEMORY where the vector could not grow: room for n more; n more appended. */
int vec32_reserve(vec32 *v, int64_t n);
int vec32_push(vec32 *v, const int32_t *xs, int64_t n);

typedef struct {
    vec32 prog, atom_ptr, atoms; /* nfa_build.c's input (its header comment) */
    int64_t size;                /* atoms with every bounded repetition written out (regex.tree's size) */
} regex_program;

/* Parses text[0..len) (UTF-8). anchored: the text ends in `\z`, which is dropped, and the rest
 * must not alternate at its top (a full match of the whole). Returns REGEX_OK, REGEX_NO_MEMORY,
 * REGEX_TOO_LARGE (a repetition count past max_count), or REGEX_UNSUPPORTED with the byte offset
 * and a static reason. The caller frees out with regex_program_free whatever the result. */
int regex_parse(const uint8_t *text, int64_t len, int32_t max_count, int anchored, regex_program *out,
                int64_t *error_at, const char **reason);

void regex_program_free(regex_program *p);

#endif
