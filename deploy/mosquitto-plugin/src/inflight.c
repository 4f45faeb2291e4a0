/* QoS 2 messages between PUBREC and PUBCOMP when their client leaves, kept for the node where
 * it resumes (issue 17).
 *
 * A client that left this node after acknowledging a QoS 2 message with PUBREC, but before it
 * got the PUBREL, holds that message and hands it to its application only at the PUBREL (paho,
 * libmosquitto: the spec's method A); a client that delivered at the PUBLISH (method B) holds
 * its packet identifier. On one broker its resume gets that PUBREL. In the cluster it resumes
 * on another Mosquitto, which never sent that message, so the old node's copy ended with the
 * session and the message was lost (about one per move under continuous QoS 2 traffic).
 *
 * So, at a client's disconnect, this module copies its outgoing QoS 2 messages in Mosquitto's
 * states "wait for PUBCOMP" and "resend PUBREL", and "wait for PUBREC" (the client may hold one
 * whose PUBREC was still on its way), and the old owner's drain sends them with its queue
 * (leaving out of it the ones Mosquitto sends its shadow again under those ids), and
 * on the new node it sends each again with the SAME packet identifier: it sets Mosquitto's
 * `last_mid` of the client just before the message is queued, at the end of a loop iteration
 * (the tick), so the next iteration's first step (`queue_plugin_msgs`) gives it that id. A
 * client holding that id acknowledges the PUBLISH with PUBREC without delivering it again
 * (MQTT 5 §4.3.3, 3.1.1 §4.3.3) and gets the PUBREL: exactly once with either method.
 *
 * A message whose PUBREC Mosquitto had already read ("wait for PUBCOMP", "resend PUBREL") is
 * marked `pubrel`: the client surely has it, and may already have completed it (its PUBCOMP
 * lost with the connection), so a PUBLISH would be new to it. The new node sends only the
 * PUBREL under that id, through Mosquitto's own `send__pubrel` (exported by the 2.0.11 binary,
 * found with dlsym): a client holding the id releases the message, one that completed it
 * answers PUBCOMP, which Mosquitto takes with a warning (unknown id). The id must be free there
 * and far from the ids Mosquitto hands out next (else the PUBCOMP would complete another
 * message); otherwise, or without the symbol, it goes as a PUBLISH as above. Mosquitto gives
 * the client's send quota one back at every PUBCOMP, its id known or not: one message more
 * would then be in flight than the client allows, and a new one would overtake the queued ones
 * (measured: order breaks). So for 30 s after such a PUBREL the quota is brought back to the
 * window less what is in flight (Mosquitto's own count) before each message Mosquitto routes
 * to the client (its READ check) and at each tick.
 *
 * Mosquitto shows none of this to a plugin: the fields are read through mirrors of Debian's
 * 2.0.11 structures (src/mosquitto_broker_internal.h, lib/mosquitto_internal.h): `msgs_out`
 * found at the sidecar's own connect from the calibrated session expiry field (calib.c) and
 * the members between them, checked to be those of a new client; `last_mid` through will.c's
 * checked mirror of the client structure. Anything else turns the module off for the run (one
 * warning): a moving client then loses such a message as before. A message whose id is in use
 * on the new node (or with the mirror off) goes with a new id; so that this is rare, a session
 * a shadow makes numbers its messages from a random id (both nodes' copies of a session would
 * otherwise count from 1 and clash). */
#include <dlfcn.h>
#include <malloc.h>
#include <stdlib.h>
#include <string.h>

#include "calib.h"
#include "inflight.h"
#include "will.h"

#define KEEP_MAX 256                 /* messages kept per client (Mosquitto's in-flight window) */
#define KEEP_BYTES (4u << 20)        /* payload bytes kept per client */
#define TOTAL_BYTES (64u << 20)      /* over every client */
#define WALK_MAX 200000              /* list nodes read before the list is taken as corrupt */
#define MID_MARGIN 64                /* ids after a released one that must be free, plus queued */
#define PUBREL_MARGIN 4096           /* ids Mosquitto may hand out before a PUBREL's PUBCOMP */
#define SETTLE_MS 30000              /* a PUBREL's PUBCOMP may come this long after it */

enum { MS_WAIT_FOR_PUBREC = 5, MS_RESEND_PUBREL = 6, MS_WAIT_FOR_PUBCOMP = 9, MS_LAST = 11,
	MD_OUT = 1 };

struct store_mirror {               /* struct mosquitto_msg_store */
	void *next;
	void *prev;
	uint64_t db_id;
	char *source_id;
	char *source_username;
	void *source_listener;
	char **dest_ids;
	int dest_id_count;
	int ref_count;
	char *topic;
	mosquitto_property *properties;
	void *payload;
	time_t message_expiry_time;
	uint32_t payloadlen;
	int origin;
	uint16_t source_mid;
	uint16_t mid;
	uint8_t qos;
	bool retain;
};

struct cmsg_mirror {                /* struct mosquitto_client_msg */
	struct cmsg_mirror *prev;
	struct cmsg_mirror *next;
	struct store_mirror *store;
	mosquitto_property *properties;
	time_t timestamp;
	uint16_t mid;
	uint8_t qos;
	bool retain;
	int direction;
	int state;
	uint8_t dup;
};

struct msgs_mirror {                /* struct mosquitto_msg_data (broker) */
	struct cmsg_mirror *inflight;
	struct cmsg_mirror *queued;
	long msg_bytes;
	long msg_bytes12;
	int msg_count;
	int msg_count12;
	int inflight_quota;
	uint16_t inflight_maximum;
};

struct kept {
	struct kept *next;
	uint16_t mid;
	uint8_t qos;
	bool owed;                       /* came from another node: Mosquitto here never had it */
	bool pubrel;                     /* its PUBREC was read: the client needs only the PUBREL */
	char *topic;
	void *payload;
	uint32_t len;
	mosquitto_property *props;
};

struct entry {
	UT_hash_handle hh;
	char *id;
	struct kept *head;
	struct kept *tail;
	unsigned count;
	size_t bytes;
	uint16_t rel_ids[KEEP_MAX];      /* PUBRELs sent from here: their PUBCOMPs may be on the way */
	unsigned n_rel;
};

static enum { ST_PENDING, ST_OK, ST_OFF } state;
static size_t msgs_out_off;          /* of msgs_out in struct mosquitto */
static struct entry *captured;       /* by client id: kept at its disconnect here */
static struct entry *releasing;      /* by client id: to send at the next tick */
struct settling {                   /* a client sent PUBRELs of ours: its PUBCOMPs may come */
	UT_hash_handle hh;
	char *id;
	int64_t until;
};
static struct settling *settling;
static size_t total_bytes;
static bool targeted;                /* a targeted QoS > 0 delivery queued this iteration */
static uint64_t n_captured, n_same_id, n_new_id, n_dropped, n_pubrel, n_clamped;
static uint64_t n_offline_full;
static long max_queued_messages;     /* Mosquitto's (0: unknown or unlimited) */
typedef int (*send_pubrel_fn)(struct mosquitto *, uint16_t, const mosquitto_property *);
static send_pubrel_fn send_pubrel;   /* Mosquitto's send__pubrel, or NULL */
static bool send_pubrel_looked;

static void turn_off(const char *why)
{
	if(state != ST_OFF){
		mosquitto_log_printf(MOSQ_LOG_WARNING, "mqfed: reading QoS 2 messages in flight is off "
				"(%s): a client that moves to another node while a QoS 2 message awaits its "
				"PUBREL may lose that message", why);
	}
	state = ST_OFF;
}

static bool fresh(const struct msgs_mirror *m)
{
	return m->inflight == NULL && m->queued == NULL && m->msg_bytes == 0 && m->msg_bytes12 == 0
		&& m->msg_count == 0 && m->msg_count12 == 0 && m->inflight_quota == m->inflight_maximum;
}

void inflight_on_sidecar_auth(struct mosquitto *client)
{
	const unsigned char *base = (const unsigned char *)client;
	size_t size, expiry, bridge, out;
	struct msgs_mirror in_m, out_m;
	void *bridge_ptr;

	if(state == ST_OFF) return;
	if(!calib_expiry_offset(&expiry)){
		turn_off("the session expiry field was not found");
		return;
	}
	size = malloc_usable_size(client);
	/* session_expiry_interval, three bools, `bridge`, msgs_in, msgs_out */
	bridge = (expiry + sizeof(uint32_t) + 3 + 7) & ~(size_t)7;
	out = bridge + sizeof(void *) + sizeof(struct msgs_mirror);
	if(size > (1u << 20) || out + sizeof(struct msgs_mirror) > size){
		turn_off("the client structure is smaller than expected");
		return;
	}
	memcpy(&bridge_ptr, base + bridge, sizeof(bridge_ptr));
	memcpy(&in_m, base + bridge + sizeof(void *), sizeof(in_m));
	memcpy(&out_m, base + out, sizeof(out_m));
	if(bridge_ptr != NULL || !fresh(&in_m) || !fresh(&out_m)){
		turn_off("the message lists are not where expected");
		return;
	}
	if(state == ST_OK && out != msgs_out_off){
		turn_off("the message lists moved at a later sidecar connect");
		return;
	}
	msgs_out_off = out;
	state = ST_OK;
}

/* How many QoS 1 and 2 messages wait in `conn`'s queue beyond its in-flight window: what
 * Mosquitto compares with max_queued_messages (db__ready_for_queue: msg_count12 less
 * inflight_maximum) before it drops one. False with the mirror off. */
bool inflight_out_queued(struct mosquitto *conn, int *queued)
{
	struct msgs_mirror m;

	if(state != ST_OK || conn == NULL) return false;
	memcpy(&m, (const unsigned char *)conn + msgs_out_off, sizeof(m));
	*queued = m.msg_count12 - (m.inflight_maximum ? (int)m.inflight_maximum : 0);
	if(*queued < 0) *queued = 0;
	return true;
}

void inflight_set_max_queued(long max_queued)
{
	max_queued_messages = max_queued > 0 ? max_queued : 0;
}

bool inflight_offline_takes(struct mosquitto *conn)
{
	struct msgs_mirror m;

	if(state != ST_OK || conn == NULL || max_queued_messages == 0) return true;
	memcpy(&m, (const unsigned char *)conn + msgs_out_off, sizeof(m));
	if(m.msg_count12 < max_queued_messages) return true;
	n_offline_full++;
	return false;
}

void inflight_on_shadow_auth(struct mosquitto *client)
{
	const char *id = mosquitto_client_id(client);
	uint16_t *last_mid;

	if(state != ST_OK || id == NULL) return;
	last_mid = client_last_mid(client);
	if(last_mid == NULL || *last_mid != 0) return; /* a new context starts at 0 */
	*last_mid = (uint16_t)(hash_bytes((uint64_t)mono_ms(), id, strlen(id)) % 65535);
}

/* Calls `fn` for each outgoing message of a live client (in flight, then queued) until it
 * returns false; false if a list does not look like Mosquitto's (the module turns off). */
static bool walk_out(struct mosquitto *conn, bool (*fn)(const struct cmsg_mirror *, void *),
		void *arg)
{
	struct msgs_mirror out;
	const struct cmsg_mirror *m;
	unsigned n = 0;
	int i;

	memcpy(&out, (const unsigned char *)conn + msgs_out_off, sizeof(out));
	for(i = 0; i < 2; i++){
		for(m = i == 0 ? out.inflight : out.queued; m; m = m->next){
			if(++n > WALK_MAX || ((uintptr_t)m & 7) || m->direction != MD_OUT || m->qos > 2
					|| m->state < 0 || m->state > MS_LAST || m->store == NULL
					|| ((uintptr_t)m->store & 7)){
				turn_off("a client's message list did not look as expected");
				return false;
			}
			if(!fn(m, arg)) return true;
		}
	}
	return true;
}

static void free_kept(struct kept *k)
{
	free(k->topic);
	free(k->payload);
	mosquitto_property_free_all(&k->props);
	free(k);
}

static void remove_entry(struct entry **table, struct entry *e)
{
	struct kept *k, *next;

	for(k = e->head; k; k = next){
		next = k->next;
		free_kept(k);
	}
	if(table == &captured) total_bytes -= e->bytes;
	HASH_DEL(*table, e);
	free(e->id);
	free(e);
}

static struct entry *entry_for(struct entry **table, const char *id)
{
	struct entry *e;

	HASH_FIND_STR(*table, id, e);
	if(e) return e;
	e = calloc(1, sizeof(*e));
	if(e == NULL) return NULL;
	e->id = xstrdup(id);
	if(e->id == NULL){
		free(e);
		return NULL;
	}
	HASH_ADD_KEYPTR(hh, *table, e->id, strlen(e->id), e);
	return e;
}

static void append(struct entry *e, struct kept *k)
{
	if(e->tail) e->tail->next = k;
	else e->head = k;
	e->tail = k;
	e->count++;
	e->bytes += k->len;
}

static struct kept *new_kept(uint16_t mid, uint8_t qos, const char *topic, const void *payload,
		uint32_t len, mosquitto_property *props)
{
	struct kept *k = calloc(1, sizeof(*k));

	if(k == NULL) return NULL;
	k->mid = mid;
	k->qos = qos;
	k->len = len;
	k->props = props;
	k->topic = xstrdup(topic);
	k->payload = malloc(len ? len : 1);
	if(k->topic == NULL || k->payload == NULL){
		free_kept(k);
		return NULL;
	}
	if(len) memcpy(k->payload, payload, len);
	return k;
}

static bool keep_one(const struct cmsg_mirror *m, void *arg)
{
	struct entry *e = arg;
	const struct store_mirror *s = m->store;
	mosquitto_property *props = NULL;
	struct kept *k;

	if(m->qos != 2 || (m->state != MS_WAIT_FOR_PUBCOMP && m->state != MS_RESEND_PUBREL
				&& m->state != MS_WAIT_FOR_PUBREC)){
		return true;
	}
	if(s->topic == NULL || (s->payloadlen && s->payload == NULL)) return true;
	if(e->count >= KEEP_MAX || e->bytes + s->payloadlen > KEEP_BYTES
			|| total_bytes + s->payloadlen > TOTAL_BYTES){
		return false;
	}
	if(s->properties && mosquitto_property_copy_all(&props, s->properties)) return true;
	/* this client's copy: the identifiers of the subscriptions it matched */
	if(subscription_ids_copy(m->properties, &props)){
		mosquitto_property_free_all(&props);
		return true;
	}
	k = new_kept(m->mid, 2, s->topic, s->payload, s->payloadlen, props);
	if(k == NULL){
		mosquitto_property_free_all(&props);
		return false;
	}
	k->pubrel = m->state != MS_WAIT_FOR_PUBREC;
	append(e, k);
	total_bytes += k->len;
	n_captured++;
	return true;
}

void inflight_capture(struct mosquitto *conn, const char *id)
{
	struct entry *e;

	if(id == NULL) return;
	inflight_forget(id);
	if(state != ST_OK) return;
	e = entry_for(&captured, id);
	if(e == NULL) return;
	walk_out(conn, keep_one, e);
	if(e->head == NULL) remove_entry(&captured, e);
}

void inflight_forget(const char *id)
{
	struct entry *e;

	if(id == NULL) return;
	HASH_FIND_STR(captured, id, e);
	if(e) remove_entry(&captured, e);
}

void inflight_forget_ids(const char *id, const cJSON *mids)
{
	struct entry *e;
	struct kept **at, *k;
	const cJSON *m;

	if(id == NULL || !cJSON_IsArray(mids)) return;
	HASH_FIND_STR(captured, id, e);
	if(e == NULL) return;
	for(at = &e->head; (k = *at) != NULL;){
		bool drop = false;
		cJSON_ArrayForEach(m, mids){
			if(cJSON_IsNumber(m) && m->valuedouble == k->mid) drop = true;
		}
		if(!drop){
			e->tail = k;
			at = &k->next;
			continue;
		}
		*at = k->next;
		e->count--;
		e->bytes -= k->len;
		total_bytes -= k->len;
		free_kept(k);
	}
	if(e->head == NULL) remove_entry(&captured, e);
}

/* Moves what waits in `releasing` for a client not connected here to `captured`, marked owed
 * (kept for its next connect here or the next node's drain); false if out of memory. */
static bool keep_owed(struct entry *pending)
{
	struct entry *owed = entry_for(&captured, pending->id);
	struct kept *k;

	if(owed == NULL) return false;
	while((k = pending->head) != NULL){
		pending->head = k->next;
		pending->count--;
		pending->bytes -= k->len;
		k->next = NULL;
		k->owed = true;
		append(owed, k);
		total_bytes += k->len;
	}
	pending->tail = NULL;
	remove_entry(&releasing, pending);
	return true;
}

cJSON *inflight_unreleased_json(const char *id, bool live_here)
{
	cJSON *arr = cJSON_CreateArray();
	struct entry *e, *pending;
	struct kept *k;

	if(arr == NULL || id == NULL) return arr;
	HASH_FIND_STR(releasing, id, pending);
	if(pending && !live_here){
		keep_owed(pending); /* as the tick would: a drain asks now */
	}
	HASH_FIND_STR(captured, id, e);
	for(k = e ? e->head : NULL; k; k = k->next){
		cJSON *o = cJSON_CreateObject();
		size_t n;
		char *b64 = b64_encode(k->payload, k->len, &n);
		cJSON *props = properties_to_json(k->props);
		cJSON *sids = subscription_ids_to_json(k->props);

		if(o == NULL || b64 == NULL){
			cJSON_Delete(o);
			cJSON_Delete(props);
			cJSON_Delete(sids);
			free(b64);
			break;
		}
		cJSON_AddNumberToObject(o, "mid", k->mid);
		cJSON_AddStringToObject(o, "topic", k->topic);
		cJSON_AddStringToObject(o, "payload", b64);
		cJSON_AddNumberToObject(o, "qos", k->qos);
		if(k->pubrel) cJSON_AddBoolToObject(o, "pubrel", true);
		if(props) cJSON_AddItemToObject(o, "properties", props);
		if(sids) cJSON_AddItemToObject(o, "subscription_ids", sids);
		free(b64);
		cJSON_AddItemToArray(arr, o);
	}
	return arr;
}

const char *inflight_release(const char *client, const cJSON *messages)
{
	const cJSON *item;
	const char *error = NULL;
	struct entry parsed = {0}, *e = NULL;
	struct kept *k;

	if(client == NULL || !cJSON_IsArray(messages) || cJSON_GetArraySize(messages) > KEEP_MAX){
		return "bad_request";
	}
	cJSON_ArrayForEach(item, messages){ /* all or nothing: each is parsed before any is kept */
		const cJSON *mid = cJSON_GetObjectItemCaseSensitive(item, "mid");
		const cJSON *pubrel = cJSON_GetObjectItemCaseSensitive(item, "pubrel");
		struct json_message m;

		if(!cJSON_IsNumber(mid) || mid->valuedouble < 1 || mid->valuedouble > 65535
				|| (pubrel != NULL && !cJSON_IsBool(pubrel))
				|| message_from_json(item, &m)){
			error = "bad_request";
			break;
		}
		if(m.qos < 1 || m.len > KEEP_BYTES){
			free(m.payload);
			mosquitto_property_free_all(&m.props);
			error = "bad_request";
			break;
		}
		k = new_kept((uint16_t)mid->valuedouble, (uint8_t)m.qos, m.topic, m.payload,
				(uint32_t)m.len, m.props);
		free(m.payload);
		if(k == NULL){
			mosquitto_property_free_all(&m.props);
			error = "internal";
			break;
		}
		k->pubrel = cJSON_IsTrue(pubrel) && k->qos == 2;
		append(&parsed, k);
	}
	if(error == NULL && parsed.head != NULL && (e = entry_for(&releasing, client)) == NULL){
		error = "internal";
	}
	while((k = parsed.head) != NULL){
		parsed.head = k->next;
		k->next = NULL;
		if(error) free_kept(k);
		else append(e, k);
	}
	return error;
}

void inflight_note_targeted(void)
{
	targeted = true;
}

static uint16_t next_mid(uint16_t mid)
{
	return mid == 65535 ? 1 : (uint16_t)(mid + 1);
}

struct span {                       /* ids [first, first + len) must be free */
	uint16_t first;
	unsigned len;
	unsigned in_use;
	bool clash;
};

static bool count_in_use(const struct cmsg_mirror *m, void *arg)
{
	struct span *s = arg;
	(void)m;
	s->in_use++;
	return true;
}

static bool find_clash(const struct cmsg_mirror *m, void *arg)
{
	struct span *s = arg;
	unsigned dist;

	if(m->mid == 0) return true;
	dist = (unsigned)((m->mid - s->first + 65535) % 65535);
	if(dist < s->len){
		s->clash = true;
		return false;
	}
	return true;
}

static bool publish_kept(const char *id, struct kept *k)
{
	int rc = mosquitto_broker_publish_copy(id, k->topic, (int)k->len, k->payload, k->qos, false,
			k->props);
	if(rc == MOSQ_ERR_SUCCESS) k->props = NULL; /* Mosquitto's now */
	return rc == MOSQ_ERR_SUCCESS;
}

/* Whether one of the PUBRELs just sent from `e` has an id in `s`. */
static bool clashes_rel(const struct entry *e, const struct span *s)
{
	for(unsigned i = 0; i < e->n_rel; i++){
		if((unsigned)((e->rel_ids[i] - s->first + 65535) % 65535) < s->len) return true;
	}
	return false;
}

static void settle_from_now(const char *id)
{
	struct settling *st;

	if(id == NULL) return;
	HASH_FIND_STR(settling, id, st);
	if(st == NULL){
		st = calloc(1, sizeof(*st));
		if(st == NULL || (st->id = xstrdup(id)) == NULL){
			free(st);
			return;
		}
		HASH_ADD_KEYPTR(hh, settling, st->id, strlen(st->id), st);
	}
	st->until = mono_ms() + SETTLE_MS;
}

static void settled(struct settling *st)
{
	HASH_DEL(settling, st);
	free(st->id);
	free(st);
}

/* Brings `conn`'s send quota down to its window less its QoS 1/2 messages in flight, if a
 * PUBCOMP of ours raised it above that. */
static void clamp_quota(struct mosquitto *conn)
{
	unsigned char *at = (unsigned char *)conn + msgs_out_off;
	struct msgs_mirror m;
	const struct cmsg_mirror *c;
	int busy = 0, room;
	unsigned n = 0;

	if(state != ST_OK) return;
	memcpy(&m, at, sizeof(m));
	if(m.inflight_maximum == 0) return;
	for(c = m.inflight; c; c = c->next){
		if(++n > WALK_MAX || ((uintptr_t)c & 7) || c->direction != MD_OUT || c->qos > 2){
			turn_off("a client's message list did not look as expected");
			return;
		}
		if(c->qos > 0) busy++;
	}
	room = (int)m.inflight_maximum - busy;
	if(room < 0) room = 0;
	if(m.inflight_quota > room){
		memcpy(at + offsetof(struct msgs_mirror, inflight_quota), &room, sizeof(room));
		n_clamped++;
	}
}

void inflight_on_read(struct mosquitto *client)
{
	struct settling *st;
	const char *id;

	if(settling == NULL || (id = mosquitto_client_id(client)) == NULL) return;
	HASH_FIND_STR(settling, id, st);
	if(st != NULL) clamp_quota(client);
}

static send_pubrel_fn pubrel_sender(void)
{
	if(!send_pubrel_looked){
		send_pubrel_looked = true;
		*(void **)(&send_pubrel) = dlsym(RTLD_DEFAULT, "send__pubrel");
		if(send_pubrel == NULL){
			mosquitto_log_printf(MOSQ_LOG_WARNING, "mqfed: Mosquitto's send__pubrel was not "
					"found: a QoS 2 message whose PUBCOMP was lost when its client moved to "
					"this node is sent again as a PUBLISH (the client may take it twice)");
		}
	}
	return send_pubrel;
}

/* Sends `conn` only the PUBREL of `mid` if the id is free and Mosquitto will not hand it out
 * before the PUBCOMP comes back (moving its counter just past `mid` if need be); false when
 * it cannot, the mirror being off included. */
static bool pubrel_only(struct mosquitto *conn, uint16_t mid)
{
	struct span s = {mid, 1, 0, false};
	send_pubrel_fn send = state == ST_OK ? pubrel_sender() : NULL;
	uint16_t *last_mid = client_last_mid(conn);
	unsigned ahead;

	if(send == NULL || last_mid == NULL || !walk_out(conn, count_in_use, &s)
			|| !walk_out(conn, find_clash, &s) || s.clash || state != ST_OK){
		return false;
	}
	/* ids Mosquitto hands out from *last_mid + 1 on; `mid` must not be among the next ones */
	ahead = (unsigned)((mid - *last_mid - 1 + 2 * 65535) % 65535);
	if(ahead < s.in_use + PUBREL_MARGIN){
		struct span after = {next_mid(mid), s.in_use + MID_MARGIN, 0, false};

		if(!walk_out(conn, find_clash, &after) || after.clash || state != ST_OK) return false;
		*last_mid = mid; /* the next ids are mid + 1, ...: mid comes round again 65,535 later */
	}
	if(send(conn, mid, NULL) != MOSQ_ERR_SUCCESS) return false;
	settle_from_now(mosquitto_client_id(conn));
	return true;
}

/* Sends the run of consecutive ids at the head of `e` with those ids, or its first message
 * with a new id when they cannot be had; first, the PUBRELs of the ones marked `pubrel`;
 * `conn`: the client's live connection here. */
static void release_head(struct entry *e, struct mosquitto *conn)
{
	struct span s;
	struct kept *k, *end;
	uint16_t *last_mid;
	bool same = false;

	while((k = e->head) != NULL && k->pubrel){
		bool released = pubrel_only(conn, k->mid);

		if(!released) break;
		e->head = k->next;
		if(e->head == NULL) e->tail = NULL;
		e->count--;
		e->bytes -= k->len;
		if(e->n_rel < KEEP_MAX) e->rel_ids[e->n_rel++] = k->mid;
		n_pubrel++;
		free_kept(k);
	}
	if(e->head == NULL) return;
	s = (struct span){e->head->mid, 1, 0, false};
	for(end = e->head; end->next && end->next->mid == next_mid(end->mid) && !end->next->pubrel;
			end = end->next){
		s.len++;
	}
	if(conn != NULL && state == ST_OK && walk_out(conn, count_in_use, &s)){
		s.len += s.in_use + MID_MARGIN; /* what is queued may take the ids after them */
		if(walk_out(conn, find_clash, &s) && !s.clash && !clashes_rel(e, &s) && state == ST_OK
				&& (last_mid = client_last_mid(conn)) != NULL){
			*last_mid = (uint16_t)(e->head->mid - 1); /* 0 for id 1: the next id is 1 */
			same = true;
		}
	}
	if(!same) end = e->head;
	for(bool last = false; !last;){
		k = e->head;
		last = k == end;
		e->head = k->next;
		if(e->head == NULL) e->tail = NULL;
		e->count--;
		e->bytes -= k->len;
		if(publish_kept(e->id, k)){
			if(same) n_same_id++;
			else n_new_id++;
		}
		free_kept(k);
	}
}

void inflight_tick(struct mosquitto *(*live_conn)(const char *id, bool *has_session))
{
	struct entry *e, *tmp;
	struct settling *st, *st_tmp;
	int64_t now = mono_ms();
	bool has_session;

	HASH_ITER(hh, settling, st, st_tmp){
		struct mosquitto *conn = live_conn(st->id, &has_session);

		if(conn == NULL || now > st->until) settled(st); /* a reconnect resets the quota */
		else clamp_quota(conn);
	}
	if(targeted){ /* queued before ours at the next iteration: they would take the ids */
		targeted = false;
		return;
	}
	HASH_ITER(hh, releasing, e, tmp){
		struct mosquitto *conn = live_conn(e->id, &has_session);

		if(conn != NULL){
			release_head(e, conn);
			if(e->head == NULL) remove_entry(&releasing, e);
		}else if(!has_session || !keep_owed(e)){
			n_dropped += e->count;
			remove_entry(&releasing, e);
		}
	}
}

void inflight_on_client_connect(const char *id, bool session_present)
{
	struct entry *e, *to = NULL;
	struct kept *k;

	if(id == NULL) return;
	HASH_FIND_STR(captured, id, e);
	if(e == NULL) return;
	if(session_present) to = entry_for(&releasing, id);
	/* Mosquitto resends the PUBRELs of its own; the owed ones are released at the tick */
	while(to != NULL && (k = e->head) != NULL){
		e->head = k->next;
		e->count--;
		e->bytes -= k->len;
		total_bytes -= k->len;
		k->next = NULL;
		if(k->owed) append(to, k);
		else free_kept(k);
	}
	if(to != NULL && to->head == NULL) remove_entry(&releasing, to);
	remove_entry(&captured, e); /* the rest: a new session, or out of memory */
}

void inflight_stats(cJSON *o)
{
	cJSON_AddStringToObject(o, "inflight_reading",
			state == ST_OK ? "ok" : state == ST_OFF ? "off" : "pending");
	cJSON_AddNumberToObject(o, "unreleased_kept", (double)n_captured);
	cJSON_AddNumberToObject(o, "unreleased_same_id", (double)n_same_id);
	cJSON_AddNumberToObject(o, "unreleased_new_id", (double)n_new_id);
	cJSON_AddNumberToObject(o, "unreleased_dropped", (double)n_dropped);
	cJSON_AddNumberToObject(o, "unreleased_pubrel", (double)n_pubrel);
	cJSON_AddNumberToObject(o, "unreleased_quota_clamped", (double)n_clamped);
	cJSON_AddNumberToObject(o, "offline_queue_full", (double)n_offline_full);
}

void inflight_cleanup(void)
{
	struct entry *e, *tmp;
	struct settling *st, *st_tmp;

	HASH_ITER(hh, captured, e, tmp) remove_entry(&captured, e);
	HASH_ITER(hh, releasing, e, tmp) remove_entry(&releasing, e);
	state = ST_PENDING;
	msgs_out_off = 0;
	total_bytes = 0;
	targeted = false;
	HASH_ITER(hh, settling, st, st_tmp) settled(st);
	n_captured = n_same_id = n_new_id = n_dropped = n_pubrel = n_clamped = n_offline_full = 0;
}
