/* Well-formed input programs to start mutating from (seeds.c). */
#ifndef MQFED_FUZZ_SEEDS_H
#define MQFED_FUZZ_SEEDS_H

#include <stddef.h>
#include <stdint.h>

struct blob {
	uint8_t *data;
	size_t size;
};

/* Appends the seeds to *out (malloc'd array of *count blobs). */
void seeds_make(struct blob **out, size_t *count);
/* Tokens the mutator inserts (NUL-terminated strings). */
extern const char *const FUZZ_DICTIONARY[];

#endif
