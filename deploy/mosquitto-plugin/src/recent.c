/* Recent publishes, for catch-up (docs/plugin-protocol.md "Catch-up"): a peer's new
 * subscription counts from its SUBACK, but this node learns of it a few milliseconds later. The
 * ring keeps every client publish of the last `catchup_ms` (at most `catchup_bytes`), and the
 * `catchup` command returns the ones a new forwarding subscription missed: routed here at or
 * after the subscription's time, matching its filter, and
 *  - plain filter: not routed to the forwarding connection at all (no forwarding subscription
 *    matched then; what did reach the sidecar is its own business: it knows where it went);
 *  - shared filter: routed before the forwarding connection joined that group here (so no member
 *    of the group, anywhere, was offered it by this node).
 * Retained publishes are not kept (they reach every node by their own path), nor messages of
 * the sidecar's connections (re-injections, which never travel twice) or of shadows.
 *
 * When was a message routed, and did it reach the forwarding connection? Mosquitto 2.0.11 tells
 * plugins neither. The sidecar's control connection subscribes to `#` (QoS 0, no retained
 * messages): every routing of a topic not starting with '$' then makes one READ check for it,
 * which is refused (that connection receives no routed message; Mosquitto only counts it as a
 * subscriber, so a v5 PUBACK never says "no matching subscribers"). That check marks the ring
 * entry routed, with its time; a READ check of the forwarding connection in the same routing
 * marks it forwarded. The entry of a READ check is found as in origin.c (same source facts): a
 * QoS 0/1 message is routed right after its MESSAGE callback, with no other callback between
 * (origin_run_seq() unchanged); a QoS 2 message at its PUBREL, later, with no callback first: it
 * is found by its store's topic pointer, alive until then, and checked against the kept copy.
 * A MESSAGE callback that sees a waiting entry's topic pointer again means its message was freed
 * without being routed (the publisher's session ended): it is never routed. An entry never seen
 * routed is never replayed. Two kinds of READ check for the control connection are not routings
 * and pass: right after its own SUBSCRIBE check, with no callback between (the retained messages
 * of its retained reads), and while it connects (its session's queued messages re-checked).
 */
#include <stdlib.h>
#include <string.h>

#include "ftrie.h"
#include "origin.h"
#include "recent.h"
#include "sidecar.h"

/* Internal to Mosquitto, exported by the 2.0.11 broker (plugin.c uses it too). Weak: without it
 * the control connection's queued messages are refused at its reconnect (see recent_read). */
extern int mosquitto__get_state(struct mosquitto *mosq) __attribute__((weak));
#define MOSQ_CS_ACTIVE 3 /* enum mosquitto_client_state in lib/mosquitto_internal.h */

#define SHARED_SUBS_MAX 100000     /* recent .fwd group joins remembered */
#define REPLY_MAX_MESSAGES 10000   /* messages per catchup reply */
#define REPLY_MAX_BYTES (8u << 20) /* payload bytes per catchup reply */

struct entry {
	struct entry *next;        /* ring order: MESSAGE callbacks, oldest first */
	UT_hash_handle hh;         /* in `pending` while a QoS 2 routing is awaited */
	const char *id_topic;      /* the store's pointers: identity only, while it lives */
	const void *id_payload;
	uint64_t run;              /* origin_run_seq() at its MESSAGE callback */
	uint64_t routed;           /* its routing's stamp (0: not seen routed) */
	int64_t born_ms;           /* MESSAGE callback time: bounds the ring */
	int64_t at_ms;             /* routing time */
	mosquitto_property *props;
	size_t size;
	uint32_t len;
	uint8_t qos;
	bool fwd;                  /* routed to the forwarding connection */
	bool pending;
	char data[];               /* topic, NUL, payload */
};

/* The forwarding connection joined a shared group (its SUBSCRIBE check), and when. */
struct shared_sub {
	struct shared_sub *next;
	uint64_t stamp;
	int64_t at_ms;
	char filter[];
};

static uint64_t window_ms;        /* option catchup_ms (0: off) */
static uint64_t max_bytes;        /* option catchup_bytes */
static struct entry *head, *tail;
static struct entry *pending;     /* QoS 2 entries awaiting their routing, by topic pointer */
static struct entry *cur;         /* the entry being routed (of the last READ check), or NULL */
static const void *cur_topic, *cur_payload; /* that READ check's message */
static uint64_t cur_run;
static struct shared_sub *subs_head, *subs_tail;
static uint64_t subs_count;
static uint64_t stamp;            /* orders routings and .fwd group joins */
static uint64_t pass_run;         /* origin_run_seq() of the control connection's SUBSCRIBE
                                   * check: READ checks for it pass until it changes */
static int64_t evicted_ms;        /* newest routing time among entries dropped unreplayed */
static uint64_t entries, bytes, replayed, requests, incomplete;

void recent_init(uint64_t ms, uint64_t max)
{
	window_ms = ms;
	max_bytes = max;
	pass_run = UINT64_MAX;
}

bool recent_enabled(void)
{
	return window_ms > 0;
}

static void pending_drop(struct entry *e)
{
	if(!e->pending) return;
	HASH_DEL(pending, e);
	e->pending = false;
}

static void drop_oldest(void)
{
	struct entry *e = head;

	head = e->next;
	if(head == NULL) tail = NULL;
	if(e == cur){
		cur = NULL;
		cur_run = 0; /* look it up again (not found) */
	}
	pending_drop(e);
	if(e->at_ms > evicted_ms) evicted_ms = e->at_ms;
	entries--;
	bytes -= e->size;
	mosquitto_property_free_all(&e->props);
	free(e);
}

static void evict(int64_t now, size_t need)
{
	while(head && (head->born_ms < now - (int64_t)window_ms || bytes + need > max_bytes)){
		drop_oldest();
	}
}

void recent_on_message(const struct mosquitto_evt_message *ed, bool record)
{
	struct entry *e = NULL;
	size_t tlen, size;
	int64_t now;

	if(window_ms == 0 || ed->topic == NULL) return;
	if(pending){
		/* this live message has that topic pointer: the waiting entry's message was freed */
		HASH_FIND_PTR(pending, &ed->topic, e);
		if(e) pending_drop(e);
	}
	if(!record) return;
	now = now_ms();
	tlen = strlen(ed->topic);
	size = sizeof(*e) + tlen + 1 + ed->payloadlen;
	evict(now, size);
	if(size > max_bytes){
		evicted_ms = now; /* too large to keep: a catch-up over it is incomplete */
		return;
	}
	e = malloc(size);
	if(e == NULL){
		evicted_ms = now;
		return;
	}
	memset(e, 0, sizeof(*e));
	memcpy(e->data, ed->topic, tlen + 1);
	if(ed->payloadlen) memcpy(e->data + tlen + 1, ed->payload, ed->payloadlen);
	if(ed->properties && mosquitto_property_copy_all(&e->props, ed->properties)){
		free(e);
		evicted_ms = now;
		return;
	}
	e->id_topic = ed->topic;
	e->id_payload = ed->payload;
	e->run = origin_run_seq();
	e->born_ms = e->at_ms = now;
	e->size = size;
	e->len = ed->payloadlen;
	e->qos = ed->qos;
	if(tail) tail->next = e;
	else head = e;
	tail = e;
	entries++;
	bytes += size;
	if(ed->qos == 2){
		HASH_ADD_PTR(pending, id_topic, e);
		e->pending = true;
	}
}

static bool same_message(const struct entry *e, const char *topic, const void *payload,
		uint32_t len)
{
	return e->id_payload == payload && e->len == len && strcmp(e->data, topic) == 0
		&& (len == 0 || memcmp(e->data + strlen(e->data) + 1, payload, len) == 0);
}

/* The ring entry whose routing makes this READ check, if any. */
static struct entry *routing(const char *topic, const void *payload, uint32_t len, uint8_t qos)
{
	uint64_t run = origin_run_seq();
	struct entry *e = NULL;

	if(cur_run == run && cur_topic == topic && cur_payload == payload) return cur;
	if(tail && tail->qos < 2 && tail->run == run && tail->id_topic == topic
			&& tail->id_payload == payload){
		e = tail;
	}else if(qos == 2 && pending){
		HASH_FIND_PTR(pending, &topic, e);
		if(e && !same_message(e, topic, payload, len)) e = NULL;
	}
	cur = e;
	cur_topic = topic;
	cur_payload = payload;
	cur_run = run;
	return e;
}


/* The properties of the client publish this READ check routes (NULL: none, or not in the
 * ring: catch-up off, a retained publish, one too large to keep). */
const mosquitto_property *recent_routed_props(const char *topic, const void *payload,
		uint32_t len, uint8_t qos)
{
	struct entry *e;

	if(window_ms == 0 || topic == NULL) return NULL;
	e = routing(topic, payload, len, qos);
	return e ? e->props : NULL;
}

/* A READ check: note the routing it belongs to. True: refuse it (the control connection's,
 * whose `#` subscription only observes routings). */
bool recent_read(struct mosquitto *client, const char *topic, const void *payload, uint32_t len,
		uint8_t qos, bool retain)
{
	bool observer;
	struct entry *e;

	if(window_ms == 0 || client == NULL || topic == NULL) return false;
	observer = client == sidecar_conn();
	e = routing(topic, payload, len, qos);
	if(e){
		if(observer){
			if(e->routed == 0){
				e->routed = ++stamp;
				if(e->qos == 2) e->at_ms = now_ms();
				pending_drop(e);
			}
		}else if(!e->fwd && sidecar_is_fwd(client)){
			e->fwd = true;
		}
	}
	(void)retain;
	if(!observer || origin_run_seq() == pass_run) return false;
	/* not a routing either: its session's queued messages re-checked while it connects (state
	 * not yet active; handle_connect.c connection_check_acl would drop the refused ones, in
	 * flight without giving their quota back, and the session would stall) */
	return mosquitto__get_state == NULL || mosquitto__get_state(client) == MOSQ_CS_ACTIVE;
}

/* The control connection's SUBSCRIBE check: the retained messages Mosquitto sends for it come
 * next, before any other callback (its retained reads), and pass. */
void recent_sidecar_checks(void)
{
	pass_run = origin_run_seq();
}

static void shared_drop_oldest(void)
{
	struct shared_sub *s = subs_head;

	subs_head = s->next;
	if(subs_head == NULL) subs_tail = NULL;
	subs_count--;
	free(s);
}

/* The forwarding connection's SUBSCRIBE or UNSUBSCRIBE check of `filter`. */
void recent_fwd_filter(const char *filter, bool subscribed)
{
	struct shared_sub *s, **pp;
	int64_t now;
	size_t len;

	if(window_ms == 0 || filter == NULL || strncmp(filter, "$share/", 7) != 0) return;
	if(!subscribed){
		for(pp = &subs_head; *pp; ){
			s = *pp;
			if(streq(s->filter, filter)){
				*pp = s->next;
				subs_count--;
				free(s);
			}else{
				pp = &s->next;
			}
		}
		for(subs_tail = subs_head; subs_tail && subs_tail->next; subs_tail = subs_tail->next){}
		return;
	}
	now = now_ms();
	while(subs_head && (subs_head->at_ms < now - (int64_t)window_ms
				|| subs_count >= SHARED_SUBS_MAX)){
		shared_drop_oldest();
	}
	len = strlen(filter);
	s = malloc(sizeof(*s) + len + 1);
	if(s == NULL) return;
	s->next = NULL;
	s->stamp = ++stamp;
	s->at_ms = now;
	memcpy(s->filter, filter, len + 1);
	if(subs_tail) subs_tail->next = s;
	else subs_head = s;
	subs_tail = s;
	subs_count++;
}

/* The stamp of the forwarding connection's latest join of `filter` (0: none in the window). */
static uint64_t joined(const char *filter)
{
	struct shared_sub *s;
	uint64_t at = 0;

	for(s = subs_head; s; s = s->next){
		if(streq(s->filter, filter)) at = s->stamp;
	}
	return at;
}

static bool matches(const char *filter, const char *topic)
{
	bool result = false;

	return mosquitto_topic_matches_sub(filter, topic, &result) == MOSQ_ERR_SUCCESS && result;
}

static int by_stamp(const void *a, const void *b)
{
	const struct entry *x = *(struct entry *const *)a, *y = *(struct entry *const *)b;

	return x->routed < y->routed ? -1 : x->routed > y->routed;
}

static cJSON *message_json(const struct entry *e, bool plain, const bool *groups, unsigned n)
{
	cJSON *m = cJSON_CreateObject(), *list;
	char *b64;
	unsigned i;

	if(m == NULL) return NULL;
	cJSON_AddStringToObject(m, "topic", e->data);
	b64 = b64_encode(e->data + strlen(e->data) + 1, e->len, NULL);
	if(b64 == NULL){
		cJSON_Delete(m);
		return NULL;
	}
	cJSON_AddStringToObject(m, "payload", b64);
	free(b64);
	cJSON_AddNumberToObject(m, "qos", e->qos);
	cJSON_AddNumberToObject(m, "t", (double)e->at_ms);
	cJSON_AddBoolToObject(m, "plain", plain);
	list = cJSON_AddArrayToObject(m, "shared");
	for(i = 0; list && i < n; i++){
		if(groups[i]) cJSON_AddItemToArray(list, cJSON_CreateNumber(i));
	}
	if(e->props) cJSON_AddItemToObject(m, "properties", properties_to_json(e->props));
	return m;
}

/* Answer a catchup command into `reply`: `messages` in routing order, each with `plain` (a plain
 * filter of the query wants it) and `shared` (indexes of the shared filters that want it), and
 * `complete` (false: the ring no longer held all of the window, or the reply was capped).
 * NULL, or an error code. */
const char *recent_catchup(const struct recent_query *q, unsigned n, cJSON *reply)
{
	struct ftrie trie = {0};
	struct entry *e, **found = NULL;
	uint64_t *joins;
	bool *groups = NULL, complete = true, want;
	int64_t since = INT64_MAX;
	size_t nfound = 0, cap = 0, i, payload = 0;
	unsigned k;
	cJSON *list;
	const char *err = NULL;

	if(window_ms == 0) return "disabled";
	joins = calloc(n, sizeof(*joins));
	groups = calloc(n ? n : 1, sizeof(*groups));
	if(joins == NULL || groups == NULL){
		err = "internal";
		goto out;
	}
	for(k = 0; k < n; k++){
		if(!ftrie_add(&trie, strip_share(q[k].filter))){
			err = "internal";
			goto out;
		}
		if(q[k].since_ms < since) since = q[k].since_ms;
		if(strncmp(q[k].filter, "$share/", 7) == 0) joins[k] = joined(q[k].filter);
	}
	if(since <= evicted_ms) complete = false;
	for(e = head; e; e = e->next){
		if(e->routed == 0 || e->at_ms < since || !ftrie_matches(&trie, e->data)) continue;
		want = false;
		for(k = 0; k < n; k++){
			if(e->at_ms < q[k].since_ms) continue;
			if(joins[k]){
				want = want || (e->routed < joins[k] && matches(strip_share(q[k].filter), e->data));
			}else if(strncmp(q[k].filter, "$share/", 7) != 0){
				want = want || (!e->fwd && matches(q[k].filter, e->data));
			}
		}
		if(!want) continue;
		if(nfound == cap){
			struct entry **more;
			cap = cap ? cap * 2 : 64;
			more = realloc(found, cap * sizeof(*found));
			if(more == NULL){
				err = "internal";
				goto out;
			}
			found = more;
		}
		found[nfound++] = e;
	}
	if(nfound) qsort(found, nfound, sizeof(*found), by_stamp);
	list = cJSON_AddArrayToObject(reply, "messages");
	for(i = 0; list && i < nfound; i++){
		bool plain = false;
		cJSON *m;

		e = found[i];
		if(i >= REPLY_MAX_MESSAGES || payload + e->len > REPLY_MAX_BYTES){
			complete = false;
			break;
		}
		for(k = 0; k < n; k++){
			groups[k] = false;
			if(e->at_ms < q[k].since_ms) continue;
			if(joins[k]){
				groups[k] = e->routed < joins[k] && matches(strip_share(q[k].filter), e->data);
			}else if(strncmp(q[k].filter, "$share/", 7) != 0 && !plain){
				plain = !e->fwd && matches(q[k].filter, e->data);
			}
		}
		m = message_json(e, plain, groups, n);
		if(m == NULL){
			err = "internal";
			goto out;
		}
		cJSON_AddItemToArray(list, m);
		payload += e->len;
		replayed++;
	}
	requests++;
	if(!complete) incomplete++;
	cJSON_AddBoolToObject(reply, "complete", complete);
	cJSON_AddNumberToObject(reply, "entries", (double)entries);
	cJSON_AddNumberToObject(reply, "bytes", (double)bytes);
out:
	ftrie_free(&trie);
	free(found);
	free(groups);
	free(joins);
	return err;
}

/* Every loop iteration: forget what is older than the window. */
void recent_tick(void)
{
	if(window_ms && head) evict(now_ms(), 0);
}

void recent_stats(struct recent_stats *s)
{
	s->entries = entries;
	s->bytes = bytes;
	s->pending = HASH_COUNT(pending);
	s->replayed = replayed;
	s->requests = requests;
	s->incomplete = incomplete;
}

void recent_cleanup(void)
{
	while(head) drop_oldest();
	while(subs_head) shared_drop_oldest();
	pending = NULL;
	cur = NULL;
	cur_topic = cur_payload = NULL;
	cur_run = 0;
	window_ms = max_bytes = 0;
	stamp = 0;
	pass_run = UINT64_MAX;
	evicted_ms = 0;
	entries = bytes = replayed = requests = incomplete = 0;
}
