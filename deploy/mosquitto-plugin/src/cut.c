/* A moving session's identities and cuts (docs/architecture.md §5, "Exactly once across a
 * move under traffic"; hold.c's cut mode uses them).
 *
 * A message injected from a batch is known by its identity: its origin node (a hash of the
 * node id, the same on every node) and its seq there (the forwarder's first seq: the same in
 * every peer's copy). While a client moves from an old node to a new one, messages reach both
 * of its copies; each must reach it once:
 * - the old copy records the identities of what it queues from its client's disconnect on
 *   (`cut_on_disconnect`, `cut_note_granted`: the newest GRANTED_MAX), and the new copy,
 *   released, leaves those out of what it kept (`move_set_skips`, `move_skips`);
 * - the new node's own messages have no identity there (they are local), so it cuts them:
 *   its cut (a seq) comes to the old node in its stream, in order, and the old copy refuses
 *   the new node's messages from it on (`cut_arrived`, `cut_refuses`); the new copy, armed at
 *   that cut, keeps them;
 * - the old node's own messages likewise: its cut comes in the last hand-over frame, and the
 *   new copy leaves out that node's messages below it (`move_set_skips`).
 * A cut can come before its client's disconnect (a takeover: the new connect first): it then
 * waits for it, at most CUT_PENDING_MS. One older than the disconnect is a stale one (a
 * stream that was down): ignored. A cut's time is its client's connect at the new node (an
 * older peer's: when it made the cut); the new node sends it to every peer (the record of
 * its client's last connect may not have reached it yet), whose sidecar passes it on only
 * for a copy its client used before that connect; one the client connected to at that time
 * or since is not that move's old copy: ignored. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cut.h"
#include "model.h"

#define CUT_PENDING_MS 10000               /* a cut waits this long for its client to leave */
#define CUT_SKEW_MS 1000                   /* clock skew between nodes allowed for a cut */
#define ENTRIES_MAX 100000u                /* clients recorded or with a cut waiting */
#define GRANTED_MAX 8192u                  /* identities an offline session keeps (the newest) */
#define ARRIVED_MAX 8u                     /* new nodes' cuts an old copy keeps (one per node) */
#define ORIGIN_SEED 0x6d71666564637574ULL  /* "mqfedcut": the same hash on every node */

struct ident {
	uint64_t origin;
	uint64_t seq;
};

/* A new node's cut, as an old copy keeps it: that node's messages from `seq` on are refused. */
struct arrived {
	uint64_t origin;
	uint64_t seq;
	int64_t at;                /* (monotonic) when it came */
};

struct move {
	UT_hash_handle hh;
	char *id;                  /* its client */
	bool open;                 /* a new copy's live hold in cut mode (hold.c) */
	bool recording;            /* its client left: its session's grants are recorded */
	int64_t since_ms;          /* (recording) the disconnect, wall clock */
	struct arrived arrived[ARRIVED_MAX]; /* the new nodes' cuts (a chain of quick moves can
	                                      * make one old copy the old one of several) */
	size_t narrived;
	struct ident *granted;     /* what the session queued: a ring of the newest */
	size_t ngranted, granted_cap, granted_next;
	struct ident *skips;       /* a new copy's release: what the old copy had, sorted */
	size_t nskips;
	struct ident *cuts;        /* ...and origins whose messages below `seq` it had */
	size_t ncuts;
};

static struct move *moves;
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
	HASH_DEL(moves, m);
	free(m->granted);
	free(m->skips);
	free(m->cuts);
	free(m->id);
	free(m);
}

static struct move *move_get(const char *id)
{
	struct move *m = move_find(id);

	if(m != NULL) return m;
	if(HASH_COUNT(moves) >= ENTRIES_MAX) return NULL;
	m = calloc(1, sizeof(*m));
	if(m == NULL || (m->id = strdup(id)) == NULL){
		free(m);
		return NULL;
	}
	HASH_ADD_KEYPTR(hh, moves, m->id, strlen(m->id), m);
	return m;
}

/* Forget the cuts that came more than `max_ms` ago (all: -1). */
static void drop_arrived(struct move *m, int64_t now, int64_t max_ms)
{
	size_t i, kept = 0;

	for(i = 0; i < m->narrived; i++){
		if(max_ms >= 0 && now - m->arrived[i].at <= max_ms) m->arrived[kept++] = m->arrived[i];
		else ignored++;
	}
	m->narrived = kept;
}

/* Forget what only mattered while the client was away. */
static void stop_recording(struct move *m)
{
	m->recording = false;
	m->narrived = 0;
	free(m->granted);
	m->granted = NULL;
	m->ngranted = m->granted_cap = m->granted_next = 0;
}

static void drop_if_empty(struct move *m)
{
	if(!m->open && !m->recording && m->narrived == 0) move_free(m);
}

struct move *move_open(const char *id)
{
	struct move *m = move_get(id);

	if(m) m->open = true;
	return m;
}

void move_close(const char *id)
{
	struct move *m = move_find(id);

	if(m == NULL) return;
	m->open = false;
	free(m->skips);
	free(m->cuts);
	m->skips = m->cuts = NULL;
	m->nskips = m->ncuts = 0;
	drop_if_empty(m);
}

void cut_on_disconnect(const char *id)
{
	struct move *m = move_get(id);

	if(m == NULL) return; /* too many: its new copy then delivers it again (duplicates) */
	drop_arrived(m, mono_ms(), CUT_PENDING_MS);
	m->granted_next = m->ngranted = 0;
	m->recording = true;
	m->since_ms = now_ms();
}

void cut_on_connect(const char *id)
{
	struct move *m = move_find(id);

	if(m == NULL) return;
	stop_recording(m);
	drop_if_empty(m);
}

static void record(struct move *m, uint64_t origin, uint64_t seq)
{
	struct ident *grown;
	size_t cap;

	if(m->ngranted == m->granted_cap && m->granted_cap < GRANTED_MAX){
		cap = m->granted_cap ? m->granted_cap * 2 : 64;
		grown = realloc(m->granted, cap * sizeof(*grown));
		if(grown != NULL){
			m->granted = grown;
			m->granted_cap = cap;
		}
	}
	if(m->granted_cap == 0) return; /* out of memory: the new copy delivers it again */
	if(m->ngranted < m->granted_cap){
		m->granted[m->ngranted].origin = origin;
		m->granted[m->ngranted].seq = seq;
		m->ngranted++;
		return;
	}
	/* full: the newest are the ones a new copy may also hold; the oldest goes */
	m->granted[m->granted_next].origin = origin;
	m->granted[m->granted_next].seq = seq;
	m->granted_next = (m->granted_next + 1) % m->granted_cap;
}

void cut_note_granted(const char *id, uint64_t origin, uint64_t seq)
{
	struct move *m = move_find(id);

	if(m != NULL && m->recording) record(m, origin, seq);
}

bool cut_refuses(const char *id, uint64_t origin, uint64_t seq)
{
	struct move *m = move_find(id);
	size_t i;

	if(m == NULL || !m->recording) return false;
	for(i = 0; i < m->narrived; i++){
		if(m->arrived[i].origin == origin && seq >= m->arrived[i].seq){
			refused++;
			return true;
		}
	}
	return false;
}

void cut_arrived(const char *id, uint64_t origin, uint64_t seq, int64_t sent_ms)
{
	struct move *m = move_find(id);
	struct client *c = model_find(id);
	size_t i;

	if(m != NULL && m->recording && sent_ms + CUT_SKEW_MS < m->since_ms){
		ignored++; /* made before its client left here: another move's */
		return;
	}
	if(c != NULL && model_client_connect_ms(c) >= sent_ms){
		/* its client connected here at that connect's time or since: this copy is not the
		 * old one of that move (its client moved on here, quicker than the cut) */
		ignored++;
		return;
	}
	if(m == NULL && (m = move_get(id)) == NULL){
		ignored++;
		return;
	}
	/* one per node: a later cut of that node (a later move) replaces its earlier one */
	for(i = 0; i < m->narrived && m->arrived[i].origin != origin; i++){
	}
	if(i == ARRIVED_MAX){ /* full: the oldest goes (that node's messages reach both copies) */
		memmove(m->arrived, m->arrived + 1, (ARRIVED_MAX - 1) * sizeof(*m->arrived));
		i = ARRIVED_MAX - 1;
		ignored++;
	}else if(i == m->narrived){
		m->narrived++;
	}
	m->arrived[i].origin = origin;
	m->arrived[i].seq = seq;
	m->arrived[i].at = mono_ms();
	applied++;
}

/* [["<origin hash, 16 hex digits>", seq], ...]; NULL: nothing recorded for `id`. */
cJSON *cut_granted_json(const char *id)
{
	struct move *m = move_find(id);
	cJSON *list, *pair;
	char hex[17];
	size_t i;

	if(m == NULL || !m->recording) return NULL;
	list = cJSON_CreateArray();
	for(i = 0; list && i < m->ngranted; i++){
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

/* Once a second: a cut that waited too long for its client to leave goes; so does the record
 * of a session that ended (no longer in the model) or whose client is back. */
void cut_tick(int64_t now)
{
	struct move *m, *tmp;
	struct client *c;

	if(moves == NULL || now - swept_ms < 1000) return;
	swept_ms = now;
	HASH_ITER(hh, moves, m, tmp){
		if(!m->recording) drop_arrived(m, now, CUT_PENDING_MS);
		if(m->recording && ((c = model_find(m->id)) == NULL || model_client_online(c))){
			stop_recording(m);
		}
		drop_if_empty(m);
	}
}

void cut_count_skipped(void)
{
	skipped++;
}

void cut_stats(cJSON *o)
{
	cJSON_AddNumberToObject(o, "cuts_applied", (double)applied);
	cJSON_AddNumberToObject(o, "cuts_ignored", (double)ignored);
	cJSON_AddNumberToObject(o, "cut_entries", HASH_COUNT(moves));
	cJSON_AddNumberToObject(o, "cut_refused", (double)refused);
	cJSON_AddNumberToObject(o, "cut_skipped", (double)skipped);
}

void cut_clear(void)
{
	struct move *m, *tmp;

	HASH_ITER(hh, moves, m, tmp){
		move_free(m);
	}
	swept_ms = 0;
	applied = ignored = refused = skipped = 0;
}
