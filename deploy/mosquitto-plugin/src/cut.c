/* A moving session's cuts and identities (hold.c's cut mode; docs/architecture.md §5,
 * "Exactly once across a move under traffic").
 *
 * A message injected from a batch is known by its identity: its origin node (a hash of the
 * node id, the same on every node) and its seq there (the forwarder's first seq: the same in
 * every peer's copy). While a client moves from an old node to a new one:
 * - the old copy records the identities it granted (`move_granted`), which the new copy skips
 *   when it releases what it kept (`move_set_skips`, `move_skips`): each message once;
 * - the new node's own messages have no identity there (they are local), so it cuts them: the
 *   old copy refuses the new node's messages from its cut on (`move_cut`), and the new copy,
 *   armed at that cut, keeps them;
 * - the old node's own messages likewise: its cut (from its hold's marker) comes in the last
 *   hand-over frame, and the new copy skips that origin's messages below it.
 * The new node's cut reaches the old one in its stream, in order, possibly before the old
 * node learnt of the move: it then waits for the old copy's `hold old` (move_open), at
 * most CUT_PENDING_MS. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cut.h"

#define CUT_PENDING_MS 10000               /* a cut waits this long for its old copy */
#define CUT_PENDING_MAX 10000u             /* clients with a cut waiting */
#define GRANTED_MAX 200000u                /* identities an old copy records (then: duplicates) */
#define ORIGIN_SEED 0x6d71666564637574ULL  /* "mqfedcut": the same hash on every node */

struct ident {
	uint64_t origin;
	uint64_t seq;
};

struct move {
	UT_hash_handle hh;
	char *id;                  /* its client */
	bool open;                 /* a hold in cut mode has it; else a cut waiting for one */
	int64_t at_ms;             /* (waiting) when the cut came */
	uint64_t cut_from;         /* the new node (old copy: whose cut applies) */
	bool have_cut;
	uint64_t cut;
	uint64_t early_origin;     /* (waiting) the cut that came before the hold: whose */
	struct ident *granted;     /* old copy: what it granted, in order */
	size_t ngranted, granted_cap;
	struct ident *skips;       /* new copy: what the old copy had, sorted */
	size_t nskips;
	struct ident *cuts;        /* new copy: origins whose messages below `seq` it had */
	size_t ncuts;
};

static struct move *moves;
static unsigned waiting;           /* moves that are only a cut waiting for its hold */
static int64_t swept_ms;
static uint64_t applied, ignored, refused, skipped;

uint64_t cut_origin_hash(const char *node, size_t len)
{
	uint64_t h = hash_bytes(ORIGIN_SEED, node, len);

	return h ? h : 1;
}

struct move *move_find(const char *id)
{
	struct move *m = NULL;

	if(moves && id) HASH_FIND_STR(moves, id, m);
	return m;
}

static void move_free(struct move *m)
{
	if(!m->open) waiting--;
	HASH_DEL(moves, m);
	free(m->granted);
	free(m->skips);
	free(m->cuts);
	free(m->id);
	free(m);
}

static struct move *move_add(const char *id)
{
	struct move *m = calloc(1, sizeof(*m));

	if(m == NULL || (m->id = strdup(id)) == NULL){
		free(m);
		return NULL;
	}
	HASH_ADD_KEYPTR(hh, moves, m->id, strlen(m->id), m);
	waiting++; /* until opened */
	return m;
}

/* `id`'s hold enters cut mode (`cut_from`: the new node, for an old copy; 0 for a new copy);
 * a cut that came for it first is taken if it is that node's. NULL: out of memory. */
struct move *move_open(const char *id, uint64_t cut_from)
{
	struct move *m = move_find(id);

	if(m != NULL && m->open) return m;
	if(m == NULL && (m = move_add(id)) == NULL) return NULL;
	m->open = true;
	waiting--;
	m->cut_from = cut_from;
	if(m->have_cut){
		if(cut_from != 0 && m->early_origin == cut_from){
			applied++;
		}else{
			m->have_cut = false;
			ignored++;
		}
	}
	return m;
}

void move_close(const char *id)
{
	struct move *m = move_find(id);

	if(m != NULL) move_free(m);
}

bool move_cut_refuses(const struct move *m, uint64_t origin, uint64_t seq)
{
	return origin == m->cut_from && m->have_cut && seq >= m->cut;
}

void move_granted(struct move *m, uint64_t origin, uint64_t seq)
{
	struct ident *grown;
	size_t cap;

	if(m->ngranted == m->granted_cap){
		if(m->granted_cap >= GRANTED_MAX) return; /* the new copy delivers the rest again */
		cap = m->granted_cap ? m->granted_cap * 2 : 64;
		grown = realloc(m->granted, cap * sizeof(*grown));
		if(grown == NULL) return;
		m->granted = grown;
		m->granted_cap = cap;
	}
	m->granted[m->ngranted].origin = origin;
	m->granted[m->ngranted].seq = seq;
	m->ngranted++;
}

/* [["<origin hash, 16 hex digits>", seq], ...] */
cJSON *move_granted_json(const struct move *m)
{
	cJSON *list = cJSON_CreateArray(), *pair;
	char hex[17];
	size_t i;

	if(list == NULL || m == NULL) return list;
	for(i = 0; i < m->ngranted; i++){
		snprintf(hex, sizeof(hex), "%016llx", (unsigned long long)m->granted[i].origin);
		pair = cJSON_CreateArray();
		if(pair == NULL) break;
		cJSON_AddItemToArray(pair, cJSON_CreateString(hex));
		cJSON_AddItemToArray(pair, cJSON_CreateNumber((double)m->granted[i].seq));
		cJSON_AddItemToArray(list, pair);
	}
	return list;
}

static int ident_cmp(const void *a, const void *b)
{
	const struct ident *x = a, *y = b;

	if(x->origin != y->origin) return x->origin < y->origin ? -1 : 1;
	return x->seq < y->seq ? -1 : x->seq > y->seq;
}

/* A seq as JSON sends it (a whole number below 2^53). */
static bool json_seq(const cJSON *v, uint64_t *seq)
{
	if(!cJSON_IsNumber(v) || v->valuedouble < 0 || v->valuedouble > 9007199254740992.0
			|| v->valuedouble != (double)(uint64_t)v->valuedouble){
		return false;
	}
	*seq = (uint64_t)v->valuedouble;
	return true;
}

/* Parse [[origin, seq], ...] (origin: hex hash with `hex`, else a node id); -1: malformed. */
static int parse_idents(const cJSON *list, bool hex, struct ident **out, size_t *n)
{
	const cJSON *pair, *o;
	size_t count = 0;
	char *end;

	*out = NULL;
	*n = 0;
	if(list == NULL) return 0;
	if(!cJSON_IsArray(list)) return -1;
	*out = calloc((size_t)cJSON_GetArraySize(list) + 1, sizeof(**out));
	if(*out == NULL) return -1;
	cJSON_ArrayForEach(pair, list){
		o = cJSON_GetArrayItem(pair, 0);
		if(!cJSON_IsArray(pair) || cJSON_GetArraySize(pair) != 2 || !cJSON_IsString(o)
				|| !json_seq(cJSON_GetArrayItem(pair, 1), &(*out)[count].seq)){
			return -1;
		}
		if(hex){
			(*out)[count].origin = strtoull(o->valuestring, &end, 16);
			if(strlen(o->valuestring) != 16 || *end != '\0') return -1;
		}else{
			(*out)[count].origin = cut_origin_hash(o->valuestring, strlen(o->valuestring));
		}
		count++;
	}
	*n = count;
	return 0;
}

int move_set_skips(struct move *m, const cJSON *granted, const cJSON *cuts)
{ /* (m NULL: only checks them) */
	struct ident *skips = NULL, *cut_list = NULL;
	size_t nskips = 0, ncuts = 0;

	if(parse_idents(granted, true, &skips, &nskips)
			|| parse_idents(cuts, false, &cut_list, &ncuts)){
		free(skips);
		free(cut_list);
		return -1;
	}
	if(m == NULL){
		free(skips);
		free(cut_list);
		return 0;
	}
	qsort(skips, nskips, sizeof(*skips), ident_cmp);
	free(m->skips);
	free(m->cuts);
	m->skips = skips;
	m->nskips = nskips;
	m->cuts = cut_list;
	m->ncuts = ncuts;
	return 0;
}

bool move_skips(const struct move *m, uint64_t origin, uint64_t seq)
{
	struct ident key = {origin, seq};
	size_t i;

	if(origin == 0) return false;
	for(i = 0; i < m->ncuts; i++){
		if(m->cuts[i].origin == origin && seq < m->cuts[i].seq) return true;
	}
	return m->nskips && bsearch(&key, m->skips, m->nskips, sizeof(key), ident_cmp) != NULL;
}

void cut_arrived(const char *id, uint64_t origin, uint64_t seq)
{
	struct move *m = move_find(id);

	if(m != NULL && m->open){
		if(m->cut_from == 0 || origin != m->cut_from){
			ignored++; /* not the cut this copy waits for */
			return;
		}
		m->have_cut = true;
		m->cut = seq;
		applied++;
		return;
	}
	if(m == NULL){
		if(waiting >= CUT_PENDING_MAX || (m = move_add(id)) == NULL){
			ignored++;
			return;
		}
	}
	m->at_ms = mono_ms();
	m->have_cut = true; /* a later cut (a later move) replaces it */
	m->early_origin = origin;
	m->cut = seq;
}

void cut_tick(int64_t now_ms)
{
	struct move *m, *tmp;

	if(waiting == 0 || now_ms - swept_ms < 1000) return;
	swept_ms = now_ms;
	HASH_ITER(hh, moves, m, tmp){
		if(!m->open && now_ms - m->at_ms > CUT_PENDING_MS){
			ignored++;
			move_free(m);
		}
	}
}

void cut_count_refused(void)
{
	refused++;
}

void cut_count_skipped(void)
{
	skipped++;
}

void cut_stats(cJSON *o)
{
	cJSON_AddNumberToObject(o, "cuts_applied", (double)applied);
	cJSON_AddNumberToObject(o, "cuts_ignored", (double)ignored);
	cJSON_AddNumberToObject(o, "cuts_pending", waiting);
	cJSON_AddNumberToObject(o, "cut_refused", (double)refused);
	cJSON_AddNumberToObject(o, "cut_skipped", (double)skipped);
}

void cut_clear(void)
{
	struct move *m, *tmp;

	HASH_ITER(hh, moves, m, tmp){
		move_free(m);
	}
	waiting = 0;
	swept_ms = 0;
	applied = ignored = refused = skipped = 0;
}
