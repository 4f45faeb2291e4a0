/* A small deterministic mutation fuzzer for the plugin (gcc has no libFuzzer): replays the
 * regression corpus, then mutates the seeds and what it kept for a given time, running each
 * input through the fuzz target under AddressSanitizer and UndefinedBehaviorSanitizer. A crash
 * (any sanitizer report aborts) writes the input to the crash folder first; commit it to the
 * corpus folder once fixed.
 *
 *   mqfed_fuzz [-seconds N] [-seed S] [-corpus DIR] [-crashes DIR] [FILE...]
 *
 * With FILEs: runs just those inputs (to reproduce a crash). */
#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <sanitizer/common_interface_defs.h>

#include "seeds.h"
#include "target.h"

#define FUZZ_MAX_INPUT (64u << 10)
#define MAX_POOL 1024

static const uint8_t *current;
static size_t current_size;
static const char *crash_dir = "build/fuzz/crashes";

static uint64_t rng_state;

static uint64_t rnd(void)
{
	/* splitmix64: deterministic for a seed */
	uint64_t z = (rng_state += 0x9e3779b97f4a7c15ULL);
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
	return z ^ (z >> 31);
}

static size_t below(size_t n)
{
	return n ? (size_t)(rnd() % n) : 0;
}

/* FNV-1a, to name crash files */
static uint64_t fnv(const uint8_t *p, size_t n)
{
	uint64_t h = 0xcbf29ce484222325ULL;

	while(n--){
		h ^= *p++;
		h *= 0x100000001b3ULL;
	}
	return h;
}

/* Runs before the process dies of a sanitizer report: keep the input that caused it. */
static void on_death(void)
{
	char path[4096];
	FILE *f;

	if(current == NULL) return;
	snprintf(path, sizeof(path), "%s/crash-%016llx", crash_dir,
			(unsigned long long)fnv(current, current_size));
	f = fopen(path, "wb");
	if(f){
		fwrite(current, 1, current_size, f);
		fclose(f);
		fprintf(stderr, "mqfed_fuzz: the failing input is in %s (reproduce: mqfed_fuzz %s)\n",
				path, path);
	}
}

static void run(const uint8_t *data, size_t size)
{
	current = data;
	current_size = size;
	mqfed_fuzz_one(data, size);
	current = NULL;
}

static int read_file(const char *path, struct blob *out)
{
	FILE *f = fopen(path, "rb");
	long size;

	if(f == NULL) return -1;
	if(fseek(f, 0, SEEK_END) != 0 || (size = ftell(f)) < 0 || fseek(f, 0, SEEK_SET) != 0){
		fclose(f);
		return -1;
	}
	out->data = malloc((size_t)size + 1);
	out->size = (size_t)size;
	if(out->data == NULL || fread(out->data, 1, out->size, f) != out->size){
		fclose(f);
		free(out->data);
		return -1;
	}
	fclose(f);
	return 0;
}

/* Replays every file of the corpus folder (regressions); returns how many. */
static size_t replay_corpus(const char *dir)
{
	DIR *d = opendir(dir);
	struct dirent *e;
	char path[4096];
	struct blob b;
	size_t n = 0;

	if(d == NULL){
		fprintf(stderr, "mqfed_fuzz: cannot open the corpus folder %s: %s\n", dir,
				strerror(errno));
		exit(2);
	}
	while((e = readdir(d)) != NULL){
		if(e->d_name[0] == '.' || strncmp(e->d_name, "README", 6) == 0) continue;
		snprintf(path, sizeof(path), "%s/%s", dir, e->d_name);
		if(read_file(path, &b) == 0){
			run(b.data, b.size);
			free(b.data);
			n++;
		}
	}
	closedir(d);
	return n;
}

static size_t dictionary_size(void)
{
	size_t n = 0;

	while(FUZZ_DICTIONARY[n]) n++;
	return n;
}

/* One mutation of buf (len bytes, room for FUZZ_MAX_INPUT) */
static size_t mutate_once(uint8_t *buf, size_t len, const struct blob *pool, size_t pool_n)
{
	static const uint8_t interesting[] = {0, 1, 0x7f, 0x80, 0xff, '"', '\\', '{', '}', '[', ']',
		',', ':', '/', '#', '+', '$', '0', '9'};
	size_t at = below(len + 1), n, from;
	const char *tok;

	switch(below(8)){
		case 0: /* flip a bit */
			if(len) buf[below(len)] ^= (uint8_t)(1u << below(8));
			break;
		case 1: /* an interesting byte */
			if(len) buf[below(len)] = interesting[below(sizeof(interesting))];
			break;
		case 2: /* erase a range */
			if(len){
				at = below(len);
				n = 1 + below(len - at < 16 ? len - at : 16);
				memmove(buf + at, buf + at + n, len - at - n);
				len -= n;
			}
			break;
		case 3: /* insert random bytes */
			n = 1 + below(8);
			if(len + n > FUZZ_MAX_INPUT) break;
			memmove(buf + at + n, buf + at, len - at);
			for(from = 0; from < n; from++) buf[at + from] = (uint8_t)rnd();
			len += n;
			break;
		case 4: /* insert a dictionary token */
			tok = FUZZ_DICTIONARY[below(dictionary_size())];
			n = strlen(tok);
			if(len + n > FUZZ_MAX_INPUT) break;
			memmove(buf + at + n, buf + at, len - at);
			memcpy(buf + at, tok, n);
			len += n;
			break;
		case 5: /* duplicate a range */
			if(len){
				uint8_t tmp[64];
				from = below(len);
				n = 1 + below(len - from < 64 ? len - from : 64);
				if(len + n > FUZZ_MAX_INPUT) break;
				memcpy(tmp, buf + from, n);
				memmove(buf + at + n, buf + at, len - at);
				memcpy(buf + at, tmp, n);
				len += n;
			}
			break;
		case 6: /* splice: the tail of another input */
			if(pool_n){
				const struct blob *o = &pool[below(pool_n)];
				from = below(o->size + 1);
				n = o->size - from;
				if(at + n > FUZZ_MAX_INPUT) n = FUZZ_MAX_INPUT - at;
				memcpy(buf + at, o->data + from, n);
				len = at + n;
			}
			break;
		default: /* a length-like byte: big or small */
			if(len) buf[below(len)] = (uint8_t)(below(2) ? below(4) : 0xff - below(4));
			break;
	}
	return len;
}

int main(int argc, char **argv)
{
	double seconds = 30;
	uint64_t seed = 1;
	const char *corpus = "fuzz/corpus";
	struct blob *pool = NULL, *seeds;
	size_t pool_n = 0, seeds_n, replayed, i;
	uint8_t *buf = malloc(FUZZ_MAX_INPUT);
	uint64_t runs = 0;
	struct timespec t0, t;
	int first_file = 0;

	for(i = 1; i < (size_t)argc; i++){
		if(strcmp(argv[i], "-seconds") == 0 && i + 1 < (size_t)argc){
			seconds = atof(argv[++i]);
		}else if(strcmp(argv[i], "-seed") == 0 && i + 1 < (size_t)argc){
			seed = strtoull(argv[++i], NULL, 10);
		}else if(strcmp(argv[i], "-corpus") == 0 && i + 1 < (size_t)argc){
			corpus = argv[++i];
		}else if(strcmp(argv[i], "-crashes") == 0 && i + 1 < (size_t)argc){
			crash_dir = argv[++i];
		}else if(argv[i][0] == '-'){
			fprintf(stderr, "usage: %s [-seconds N] [-seed S] [-corpus DIR] [-crashes DIR] "
					"[FILE...]\n", argv[0]);
			return 2;
		}else{
			first_file = (int)i;
			break;
		}
	}
	if(buf == NULL) return 1;
	__sanitizer_set_death_callback(on_death);
	if(first_file){
		for(i = (size_t)first_file; i < (size_t)argc; i++){
			struct blob b;
			if(read_file(argv[i], &b) != 0){
				fprintf(stderr, "mqfed_fuzz: cannot read %s\n", argv[i]);
				return 2;
			}
			run(b.data, b.size);
			free(b.data);
			printf("mqfed_fuzz: %s ran clean\n", argv[i]);
		}
		return 0;
	}

	replayed = replay_corpus(corpus);
	seeds_make(&seeds, &seeds_n);
	pool = calloc(MAX_POOL, sizeof(*pool));
	if(pool == NULL) return 1;
	for(i = 0; i < seeds_n; i++){
		run(seeds[i].data, seeds[i].size);
		pool[pool_n++] = seeds[i];
	}
	free(seeds);
	rng_state = seed;
	clock_gettime(CLOCK_MONOTONIC, &t0);
	for(;;){
		const struct blob *base = &pool[below(pool_n)];
		size_t len = base->size < FUZZ_MAX_INPUT ? base->size : FUZZ_MAX_INPUT, k, m = 1 + below(6);

		memcpy(buf, base->data, len);
		for(k = 0; k < m; k++) len = mutate_once(buf, len, pool, pool_n);
		run(buf, len);
		runs++;
		/* keep a few mutants to mutate further (no coverage feedback: a random sample) */
		if(below(64) == 0){
			struct blob keep = {malloc(len + 1), len};
			if(keep.data){
				memcpy(keep.data, buf, len);
				if(pool_n < MAX_POOL){
					pool[pool_n++] = keep;
				}else{
					k = seeds_n + below(MAX_POOL - seeds_n);
					free(pool[k].data);
					pool[k] = keep;
				}
			}
		}
		if((runs & 255) == 0){
			clock_gettime(CLOCK_MONOTONIC, &t);
			if((double)(t.tv_sec - t0.tv_sec) + (t.tv_nsec - t0.tv_nsec) / 1e9 >= seconds) break;
		}
	}
	clock_gettime(CLOCK_MONOTONIC, &t);
	printf("mqfed_fuzz: %zu corpus inputs replayed, %zu seeds, %llu mutated inputs in %.0f s "
			"(seed %llu): no sanitizer report\n", replayed, seeds_n, (unsigned long long)runs,
			(double)(t.tv_sec - t0.tv_sec) + (t.tv_nsec - t0.tv_nsec) / 1e9,
			(unsigned long long)seed);
	for(i = 0; i < pool_n; i++) free(pool[i].data);
	free(pool);
	free(buf);
	return 0;
}
