/*
 * Capture (issue 25, slice 2; docs/plugin-protocol.md "Capture socket", docs/architecture.md
 * "The C bridge"): a client's message that the forwarding connection (`<sidecar_id>.fwd`)
 * would get becomes one MQFB record, written to a unix socket the sidecar listens on, and the
 * READ check of `.fwd` is refused, so Mosquitto queues no copy for it. On only with the
 * `capture_socket` option.
 *
 * Which message a READ check routes is found as origin.c, journal.c and recent.c find it
 * (origin.c explains the Mosquitto 2.0.11 facts): the MESSAGE callback sees the store's topic
 * and payload pointers, the publisher and the properties, and makes an identity for a message a
 * forwarding filter matches. A QoS 0/1 message is routed right after its MESSAGE callback, with
 * no other callback between (origin_run_seq() unchanged); a QoS 2 message at its PUBREL, later:
 * it is kept by its store's topic pointer (checked against a hash of topic and payload) until
 * its routing, a new message with that pointer, 60 s, or Q2_MAX entries (the oldest first). The
 * first plain READ check of `.fwd` for an identified message appends its record and is refused;
 * every later one for it is refused too (one record per message). A message without an
 * identity (a will, $SYS, another plugin's, the sidecar's own, one whose identity was
 * forgotten) takes the MQTT path as before: its check is allowed.
 *
 * Records stay in memory until the sidecar acknowledges them (capbuf.c holds them and writes
 * them to the socket). At most `capture_max_bytes` are held: past that a QoS 0 message is
 * dropped (counted) and a QoS 1/2 message takes the MQTT path (its check allowed: counted as
 * `passed`), so nothing acknowledged is lost here.
 */
#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "batch.h"
#include "calib.h"
#include "capbuf.h"
#include "capture.h"
#include "ftrie.h"
#include "linkout.h"
#include "origin.h"
#include "shed.h"
#include "will.h"

#define Q2_MAX 65535               /* QoS 2 messages awaiting their PUBREL, identified */
#define Q2_MAX_AGE_MS 60000

/* The MESSAGE-time identity of a message. */
struct ident {
	const char *topic;             /* the store's pointers: identity only, while it lives */
	const void *payload;
	uint32_t len;
	uint8_t qos;
	bool retain;
	uint64_t run;                  /* origin_run_seq() at its MESSAGE callback */
	char *client;                  /* the publisher's client id */
	size_t client_len;
	uint8_t *props;                /* MQTT v5 encoding (a message expiry last, if any) */
	uint32_t props_len;
	uint32_t expiry;               /* Message Expiry Interval at its MESSAGE callback (0: none) */
	int64_t born_ms;               /* its MESSAGE callback (monotonic) */
	enum { ID_NEW, ID_CAPTURED, ID_PASSED, ID_DROPPED } fate;
	bool counted;                  /* `plain` is known (at its first check of .fwd) */
	unsigned plain;                /* .fwd's plain subscriptions matching (UINT_MAX: all) */
	unsigned checks;               /* READ checks of .fwd seen for it */
};

/* A filter `.fwd` subscribes to: its shared ones make READ checks capture must leave alone. */
struct fwd_filter {
	UT_hash_handle hh;             /* keyed by filter, verbatim */
	bool shared;
	char filter[];
};

struct q2e {
	UT_hash_handle hh;             /* keyed by id.topic (the pointer) */
	struct ident id;
	uint64_t hash;                 /* of topic and payload */
	int64_t born_ms;
	bool verified;                 /* a READ check matched its contents */
	bool hit;                      /* its routing ran (dropped once that routing is over) */
	uint64_t hit_run;
	struct q2e *next_hit;
};

static bool enabled;
static uint64_t max_bytes;
static uint64_t hash_seed;
static uint64_t dropped, passed;

static struct fwd_filter *filters;
static struct ftrie shared_trie;   /* .fwd's shared filters, without $share/<group>/ */
static struct ftrie plain_trie;    /* .fwd's plain filters */
static time_t filters_drop_at;     /* .fwd offline: its session (and filters) end then */

static bool cur_set;
static struct ident cur;           /* the QoS 0/1 message of the last MESSAGE callback */
static struct q2e *q2;
static struct q2e *hits;

int capture_init(const char *socket_path, uint64_t max, uint64_t plugin_epoch)
{
	if(socket_path == NULL || socket_path[0] == '\0') return 0;
	if(capbuf_init(socket_path, plugin_epoch)) return -1;
	max_bytes = max;
	hash_seed = plugin_epoch;
	enabled = true;
	mosquitto_log_printf(MOSQ_LOG_NOTICE, "mqfed: capture on: the forwarding connection's "
			"messages go to the sidecar over %s (at most %llu bytes held)", socket_path,
			(unsigned long long)max_bytes);
	return 0;
}

bool capture_enabled(void)
{
	return enabled;
}

/* ---- .fwd's subscriptions ---------------------------------------------------------------- */

static void filters_clear(void)
{
	struct fwd_filter *f, *tmp;

	HASH_ITER(hh, filters, f, tmp){
		HASH_DEL(filters, f);
		free(f);
	}
	ftrie_free(&shared_trie);
	ftrie_free(&plain_trie);
}

/* `.fwd`'s SUBSCRIBE (or UNSUBSCRIBE) check of `filter`. Mosquitto checks a message's plain
 * subscriptions of a client before its shared ones (origin.c, fact 4), so a routing's first
 * checks of .fwd, as many as its plain filters matching, are plain, and the rest are the picks
 * of its shared groups, which keep the MQTT path (the sidecar reads the group from the
 * Subscription Identifier). */
void capture_fwd_filter(const char *filter, bool subscribed)
{
	struct fwd_filter *f = NULL;
	size_t len;

	if(!enabled || filter == NULL) return;
	len = strlen(filter);
	HASH_FIND(hh, filters, filter, len, f);
	if(subscribed && f == NULL){
		f = malloc(sizeof(*f) + len + 1);
		if(f == NULL) return;
		memcpy(f->filter, filter, len + 1);
		f->shared = strncmp(filter, "$share/", 7) == 0;
		if(!ftrie_add(f->shared ? &shared_trie : &plain_trie, strip_share(f->filter))){
			free(f);
			return;
		}
		HASH_ADD(hh, filters, filter[0], len, f);
	}else if(!subscribed && f != NULL){
		ftrie_remove(f->shared ? &shared_trie : &plain_trie, strip_share(f->filter));
		HASH_DEL(filters, f);
		free(f);
	}
}

/* `.fwd` connected; with a clean start, or after its offline session expired, its old
 * subscriptions are gone. */
void capture_fwd_connected(bool clean_start)
{
	if(clean_start || (filters_drop_at != 0 && time(NULL) >= filters_drop_at)) filters_clear();
	filters_drop_at = 0;
}

/* `.fwd` went offline with this session expiry (s; 0: its session ended; unknown, without a
 * calibrated offset: kept, as the sidecar's session lasts). A filter kept too long or forgotten
 * too early only miscounts a routing's plain checks of a topic one of its shared filters
 * matches: the group's pick of .fwd may then become a record. */
void capture_fwd_disconnected(int64_t expiry)
{
	if(expiry == 0) filters_clear();
	else if(expiry > 0 && expiry < EXPIRY_NEVER) filters_drop_at = time(NULL) + (time_t)expiry;
}

/* How many plain subscriptions of .fwd match `topic`; UINT_MAX when no shared one does
 * (then every check is plain, and nothing needs counting). */
static unsigned plain_matches(const char *topic)
{
	size_t n;

	if(!ftrie_matches(&shared_trie, topic)) return UINT_MAX;
	n = ftrie_count(&plain_trie, topic);
	return n >= UINT_MAX ? UINT_MAX - 1 : (unsigned)n;
}

/* ---- message expiry ------------------------------------------------------------------------ */

static uint32_t be32(const uint8_t *p)
{
	return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

/* An MQTT variable byte integer at b[*pos..n); false when malformed or cut short. */
static bool varint(const uint8_t *b, uint32_t n, uint32_t *pos, uint32_t *out)
{
	uint32_t v = 0;
	int i;

	for(i = 0; i < 4 && *pos < n; i++){
		v |= (uint32_t)(b[*pos] & 0x7F) << (7 * i);
		if(!(b[(*pos)++] & 0x80)){
			*out = v;
			return true;
		}
	}
	return false;
}

/* The Message Expiry Interval of the PUBLISH whose MESSAGE callback this is (0: none, or the
 * packet cannot be read). Mosquitto 2.0.11 keeps it out of the callback's properties, in its
 * store; the packet it is reading from the client (in_packet, through will.c's checked mirror
 * of `struct mosquitto`) still holds it. The packet must be that message: a PUBLISH of its QoS
 * whose properties parse exactly and whose payload is the message's (length, first and last
 * bytes). */
static uint32_t publish_expiry(const struct mosquitto_evt_message *ed)
{
	const uint8_t *b;
	uint32_t n, pos, plen, end, k, v, expiry = 0, cmp;
	uint8_t command, id;

	if(mosquitto_client_protocol_version(ed->client) != 5) return 0;
	if(!client_in_packet(ed->client, &b, &n, &command)) return 0;
	if((command & 0xF0) != 0x30 || ((command >> 1) & 3) != ed->qos || n < 2) return 0;
	pos = 2 + ((uint32_t)b[0] << 8 | b[1]) + (ed->qos ? 2 : 0);
	if(pos > n || !varint(b, n, &pos, &plen) || plen > n - pos) return 0;
	end = pos + plen;
	if(n - end != ed->payloadlen) return 0;
	cmp = ed->payloadlen < 64 ? ed->payloadlen : 64;
	if(cmp && (memcmp(b + end, ed->payload, cmp) != 0
			|| memcmp(b + n - cmp, (const uint8_t *)ed->payload + ed->payloadlen - cmp, cmp))){
		return 0;
	}
	while(pos < end){
		id = b[pos++];
		switch(id){
			case MQTT_PROP_PAYLOAD_FORMAT_INDICATOR: k = 1; break;
			case MQTT_PROP_TOPIC_ALIAS: k = 2; break;
			case MQTT_PROP_MESSAGE_EXPIRY_INTERVAL: k = 4; break;
			case MQTT_PROP_CONTENT_TYPE:
			case MQTT_PROP_RESPONSE_TOPIC:
			case MQTT_PROP_CORRELATION_DATA:
				if(end - pos < 2) return 0;
				k = 2 + ((uint32_t)b[pos] << 8 | b[pos + 1]);
				break;
			case MQTT_PROP_USER_PROPERTY:
				if(end - pos < 2) return 0;
				k = 2 + ((uint32_t)b[pos] << 8 | b[pos + 1]);
				if(end - pos < k + 2) return 0;
				k += 2 + ((uint32_t)b[pos + k] << 8 | b[pos + k + 1]);
				break;
			case MQTT_PROP_SUBSCRIPTION_IDENTIFIER:
				if(!varint(b, end, &pos, &v)) return 0;
				k = 0;
				break;
			default:
				return 0;
		}
		if(end - pos < k) return 0;
		if(id == MQTT_PROP_MESSAGE_EXPIRY_INTERVAL) expiry = be32(b + pos);
		pos += k;
	}
	return expiry;
}

/* Append the Message Expiry Interval property to an identity's encoded properties (its value
 * is set to what remains when the record is made). */
static bool add_expiry(struct ident *id, uint32_t expiry)
{
	uint8_t *grown;

	if(expiry == 0) return true;
	grown = realloc(id->props, (size_t)id->props_len + 5);
	if(grown == NULL) return false;
	id->props = grown;
	grown[id->props_len] = MQTT_PROP_MESSAGE_EXPIRY_INTERVAL;
	id->props_len += 5;
	id->expiry = expiry;
	return true;
}

/* ---- identities ---------------------------------------------------------------------------- */

static void ident_free(struct ident *id)
{
	free(id->client);
	free(id->props);
	memset(id, 0, sizeof(*id));
}

static uint64_t contents_hash(const char *topic, const void *payload, uint32_t len)
{
	uint64_t h = hash_bytes(hash_seed, topic, strlen(topic));

	return hash_bytes(h, payload, payload ? len : 0);
}

static void q2_del(struct q2e *e)
{
	struct q2e **pp;

	if(e->hit){
		for(pp = &hits; *pp; pp = &(*pp)->next_hit){
			if(*pp == e){
				*pp = e->next_hit;
				break;
			}
		}
	}
	HASH_DEL(q2, e);
	ident_free(&e->id);
	free(e);
}

/* QoS 2 entries whose routing ran in an earlier callback: routed once, forgotten now. */
static void purge_hits(void)
{
	uint64_t run = origin_run_seq();
	struct q2e **pp = &hits, *e;

	while(*pp){
		e = *pp;
		if(e->hit_run != run){
			*pp = e->next_hit;
			e->hit = false;
			q2_del(e);
		}else{
			pp = &e->next_hit;
		}
	}
}

void capture_on_message(const struct mosquitto_evt_message *ed)
{
	struct q2e *e = NULL;
	struct ident id;
	const char *client;

	if(!enabled || ed->topic == NULL) return;
	purge_hits();
	if(q2){
		/* a live message has this topic pointer: that entry's message was freed unrouted */
		HASH_FIND_PTR(q2, &ed->topic, e);
		if(e) q2_del(e);
	}
	if(cur_set){
		ident_free(&cur);
		cur_set = false;
	}
	if(!shed_wanted(ed->topic)) return; /* no forwarding filter matches: never checked */

	memset(&id, 0, sizeof(id));
	id.topic = ed->topic;
	id.payload = ed->payload;
	id.len = ed->payloadlen;
	id.qos = (uint8_t)ed->qos;
	id.retain = ed->retain;
	id.run = origin_run_seq();
	client = mosquitto_client_id(ed->client);
	id.client_len = client ? strlen(client) : 0;
	if(id.client_len > UINT16_MAX) return;
	id.client = malloc(id.client_len + 1);
	if(id.client == NULL) return; /* no identity: the MQTT path, as before */
	if(id.client_len) memcpy(id.client, client, id.client_len);
	if(!mqfb_encode_props(ed->properties, &id.props, &id.props_len)
			|| !add_expiry(&id, publish_expiry(ed))){
		free(id.client);
		free(id.props);
		return;
	}
	id.born_ms = mono_ms();
	if(ed->qos < 2){
		cur = id;
		cur_set = true;
		return;
	}
	while(q2 && HASH_COUNT(q2) >= Q2_MAX) q2_del(q2); /* the oldest */
	e = calloc(1, sizeof(*e));
	if(e == NULL){
		ident_free(&id);
		return;
	}
	e->id = id;
	e->hash = contents_hash(ed->topic, ed->payload, ed->payloadlen);
	e->born_ms = mono_ms();
	HASH_ADD_PTR(q2, id.topic, e);
}

/* The identity of the message this READ check routes, or NULL. */
static struct ident *routed(const char *topic, const void *payload, uint32_t len, uint8_t qos)
{
	struct q2e *e = NULL;

	if(cur_set && cur.run == origin_run_seq() && cur.topic == topic && cur.payload == payload
			&& cur.len == len && cur.qos == qos){
		return &cur;
	}
	if(qos != 2 || q2 == NULL) return NULL;
	HASH_FIND_PTR(q2, &topic, e);
	if(e == NULL || e->id.payload != payload || e->id.len != len) return NULL;
	if(!e->verified){
		if(e->hash != contents_hash(topic, payload, len)) return NULL;
		e->verified = true;
	}
	if(!e->hit){
		e->hit = true;
		e->hit_run = origin_run_seq();
		e->next_hit = hits;
		hits = e;
	}
	return &e->id;
}

/* Set the Message Expiry Interval of `id`'s encoded properties to what remains of it. */
static void age_expiry(const struct ident *id)
{
	if(id->expiry){ /* what remains of it, as Mosquitto gives a subscriber (at least 1 s) */
		int64_t gone = (mono_ms() - id->born_ms) / 1000;
		uint32_t left = gone >= (int64_t)id->expiry ? 1 : id->expiry - (uint32_t)gone;
		uint8_t *at = id->props + id->props_len - 4;

		at[0] = (uint8_t)(left >> 24);
		at[1] = (uint8_t)(left >> 16);
		at[2] = (uint8_t)(left >> 8);
		at[3] = (uint8_t)left;
	}
}

/* Append the record of `id` (its topic and payload from the READ check: the store's own;
 * its expiry aged already). */
static bool append(const struct ident *id, const char *topic, const void *payload)
{
	return capbuf_append(MQFB_KIND_MESSAGE, id->qos, id->retain, topic, strlen(topic),
			id->client, id->client_len, id->props, id->props_len, payload, id->len);
}

/* A plain READ check of `.fwd` (live, or its offline session) for this message. True: refuse
 * it (its record holds the message, or a QoS 0 message was dropped past the bound);
 * *recorded: this check made the record. */
bool capture_read(const char *topic, const void *payload, uint32_t len, uint8_t qos,
		bool *recorded)
{
	struct ident *id;
	size_t size;

	*recorded = false;
	if(!enabled || topic == NULL) return false;
	purge_hits();
	id = routed(topic, payload, len, qos);
	if(id == NULL) return false;
	if(!id->counted){
		id->plain = plain_matches(topic);
		id->counted = true;
	}
	if(id->plain != UINT_MAX && ++id->checks > id->plain) return false; /* a shared pick */
	switch(id->fate){
		case ID_CAPTURED:
		case ID_DROPPED:
			return true;
		case ID_PASSED:
			return false;
		default:
			break;
	}
	age_expiry(id);
	if(linkout_active() && linkout_take(qos, id->retain, topic, id->client, id->client_len,
				id->props, id->props_len, payload, id->len)){
		id->fate = ID_CAPTURED; /* the links carry it (linkout.c); not the journal's yet */
		return true;
	}
	size = mqfb_record_size(strlen(topic), id->client_len, id->props_len, id->len);
	if(capbuf_bytes() + size > max_bytes){
		if(qos == 0){
			dropped++;
			id->fate = ID_DROPPED;
			return true;
		}
		passed++;
		id->fate = ID_PASSED; /* the MQTT path: Mosquitto queues .fwd its copy */
		return false;
	}
	if(!append(id, topic, payload)){
		id->fate = ID_PASSED;
		return false;
	}
	id->fate = ID_CAPTURED;
	*recorded = true;
	return true;
}

/* A marker in the record stream, in order with the records (docs/plugin-protocol.md, "Capture
 * socket"): a moving session's cut (MQFB_KIND_CUT, `client` its id) or a barrier
 * (MQFB_KIND_BARRIER, `token` the sidecar's). Not bounded by capture_max_bytes (they are
 * small and what waits for them must not be lost). False when capture is off or out of
 * memory: the caller sends the probe by MQTT instead. */
bool capture_marker(uint8_t kind, const char *client, const void *token, uint32_t token_len)
{
	size_t n = client ? strlen(client) : 0;

	if(!enabled) return false;
	return capbuf_append(kind, 0, false, "", 0, client ? client : "", n, NULL, 0, token,
			token_len);
}

/* The end of a loop iteration: forget what is stale; the socket (capbuf.c) connects, reads
 * acks and writes this iteration's records. */
void capture_tick(void)
{
	int64_t now;

	if(!enabled) return;
	purge_hits();
	now = mono_ms();
	while(q2 && (now - q2->born_ms > Q2_MAX_AGE_MS || now < q2->born_ms)) q2_del(q2);
	capbuf_tick();
}

void capture_stats(struct capture_stats *s)
{
	struct capbuf_stats b;

	capbuf_stats(&b);
	memset(s, 0, sizeof(*s));
	s->on = enabled;
	s->connected = b.connected;
	s->next_seq = b.next_seq;
	s->records = b.records;
	s->buffered = b.buffered;
	s->buffered_bytes = b.buffered_bytes;
	s->acked = b.acked;
	s->dropped = dropped;
	s->passed = passed;
	s->connects = b.connects;
	s->malformed = b.malformed;
	s->sent_bytes = b.sent_bytes;
}

void capture_cleanup(void)
{
	struct q2e *e, *tmp;

	capbuf_cleanup();
	HASH_ITER(hh, q2, e, tmp){
		HASH_DEL(q2, e);
		ident_free(&e->id);
		free(e);
	}
	q2 = hits = NULL;
	filters_clear();
	filters_drop_at = 0;
	if(cur_set) ident_free(&cur);
	cur_set = false;
	enabled = false;
	max_bytes = hash_seed = dropped = passed = 0;
}
