/* Re-injection of a whole batch inside Mosquitto (inject.h). The sidecar publishes a frame's
 * messages as one MQFB batch to `$CONTROL/mqfed/inject` (on its control or its forwarding
 * connection); Mosquitto hands it to this callback
 * and never routes it (handle_publish.c: `$CONTROL/` goes to control__process). Every record
 * is checked before any is published: a malformed batch is refused whole. Then each message is
 * handed to mosquitto_broker_publish (appended to db.plugin_msgs) and, last, the reply to the
 * sidecar: queue_plugin_msgs (loop.c) routes that list in order at the top of the next loop
 * iteration, so the reply arrives once every message of the batch sits in its subscribers'
 * queues. Injected messages are routed without a client: origin.c tells their READ checks
 * apart (origin_injected) so that shared subscriptions and forwarding shards never get them.
 *
 * The reply waits for the TICK that ends the iteration that routed the batch, and says how
 * full the fullest subscriber's queue was then (`queued`: QoS 1 and 2 messages past its
 * in-flight window, what Mosquitto compares with max_queued_messages before it drops one;
 * -1 when no live client got one of the batch's messages, or the queues are not readable):
 * a batch puts a whole frame in the queues in one iteration, where Mosquitto's reads let a
 * subscriber's PUBACKs take one message each, so the sidecar sizes its next batches to the
 * room left (sidecar/routing/injection.py).
 *
 * A slow subscriber must not hold the others back (docs/architecture.md, "A slow subscriber
 * holds the others back"): on one Mosquitto a subscriber that reads slower than its topics'
 * traffic loses what overflows its own queue and the others are not slowed, where the fullest
 * queue would pace every batch carrying its topics to it. So `queued` leaves out a client
 * whose queue has stayed near the bound (FULL_NUM / FULL_DEN of max_queued_messages: three
 * quarters of the sidecar's bound, half of it) for LEAVE_OUT_MS since it first held back
 * another subscriber: a client that got a message of the same loop iteration's batches with
 * its queue under that mark. Left out, it loses what overflows as on one broker. A client
 * alone near the bound (a backlog draining to its one subscriber, a burst) is never left
 * out: the batches wait for its room and it loses nothing. The state is kept per client id
 * for clients near the bound only (at most SLOW_MAX), reset when a measure finds the queue
 * under the mark or the client disconnects, and freed at the next sweep (every SWEEP_MS, also
 * of clients not measured for STALE_MS). */
#include <stdio.h>
#include <string.h>

#include "batch.h"
#include "cut.h"
#include "inflight.h"
#include "inject.h"
#include "linkin.h"
#include "origin.h"
#include "sidecar.h"

struct prepared {
	char *topic;
	const uint8_t *payload;
	uint32_t payload_len;
	uint8_t qos;
	bool retain;
	mosquitto_property *props;
	struct injected_id id;           /* pointing into the batch (origin.c) */
	bool cut;                        /* a kind 2 record: a moving session's cut (hold.c) */
	char *cut_client;                /* ...its client id, */
	uint64_t sent;                   /* and when it was made (HLC) */
};

static uint64_t n_batches, n_messages, n_refused;

/* The reply goes to the connection that sent the batch: QoS 1 to the control connection, QoS 0
 * to the forwarding connection (whose packet ids the sidecar reads as copies in routing
 * order, sidecar/local/midgaps.py; a lost reply is the sidecar's timeout). */
static const char *reply_to;
static int reply_qos;
static bool reply_link;          /* to a link (linkin.c): its replies carry the bound */
static long link_bound;          /* half of max_queued_messages (0: unknown): a link's bound */

/* A reply owed for a batch handed to Mosquitto: sent at the TICK after its routing. */
struct owed {
	struct owed *next;
	char *to;
	uint64_t id;
	unsigned count;
	int qos;
	bool link;                 /* to a link: with the bound it paces itself to (room.c) */
	bool routed;               /* a TICK passed since: its routing ran at the top of this
	                            * iteration */
};
static struct owed *owed_head, **owed_tail = &owed_head;
static int fullest = -1;     /* the fullest queue seen in this iteration's routing (-1: none) */
static bool queued_now;      /* a batch's message went into Mosquitto's queue this iteration */

#define FULL_NUM 3                /* near the bound: max_queued_messages * 3 / 8 */
#define FULL_DEN 8
#define LEAVE_OUT_MS 250          /* near the bound this long after it held another back */
#define SLOW_MAX 1024             /* clients near the bound tracked (others count as before) */
#define SEEN_MAX 64               /* clients near the bound noted per loop iteration */
#define SWEEP_MS 1000
#define STALE_MS 10000

/* A client measured near the bound. */
struct slow {
	UT_hash_handle hh;
	char *id;
	int64_t full_ms;              /* near the bound since (0: no longer: freed at the sweep) */
	int64_t held_ms;              /* first held another client back since then (0: not yet) */
	int64_t seen_ms;              /* last measured */
	uint64_t seen_iter;           /* the loop iteration it was last noted in `seen` */
	const struct mosquitto *conn; /* its connection then (compared, never read) */
};
static struct slow *slow_clients;
static unsigned n_slow;
static struct slow *seen[SEEN_MAX]; /* near the bound in this iteration's routing */
static unsigned n_seen;
static const struct mosquitto *room[2]; /* clients under the mark that got a message in this
                                         * iteration (two are enough to tell another apart) */
static unsigned n_room;
static uint64_t iteration = 1;
static int full_at;               /* the mark (0: off, max_queued_messages unknown or unlimited) */
static int64_t last_sweep_ms;
static uint64_t n_left_out;       /* measures left out of `queued` */

static void send_reply(const char *to, int qos, const char *buf, int n)
{
	if(n < 0 || n >= 200) return;
	if(mosquitto_broker_publish_copy(to, MQFED_INJECT_REPLY, n, buf, qos, false,
				NULL) != MOSQ_ERR_SUCCESS){
		mosquitto_log_printf(MOSQ_LOG_WARNING, "mqfed: publishing an inject reply failed");
	}
}

static void reply(uint64_t id, const char *error, unsigned count, unsigned at)
{
	char buf[200];
	int n;
	struct owed *o;

	if(error){
		n = snprintf(buf, sizeof(buf),
				"{\"v\":1,\"cmd\":\"inject\",\"batch\":%llu,\"ok\":false,\"error\":\"%s\",\"at\":%u}",
				(unsigned long long)id, error, at);
		send_reply(reply_to, reply_qos, buf, n);
		return;
	}
	o = calloc(1, sizeof(*o));
	if(o != NULL) o->to = strdup(reply_to);
	if(o == NULL || o->to == NULL){ /* answer now, without a measure */
		free(o);
		n = snprintf(buf, sizeof(buf), "{\"v\":1,\"cmd\":\"inject\",\"batch\":%llu,\"ok\":true,"
				"\"count\":%u,\"queued\":-1}", (unsigned long long)id, count);
		send_reply(reply_to, reply_qos, buf, n);
		return;
	}
	o->id = id;
	o->count = count;
	o->qos = reply_qos;
	o->link = reply_link;
	*owed_tail = o;
	owed_tail = &o->next;
}

void inject_set_max_queued(long max_queued)
{
	full_at = max_queued > 0 ? (int)((max_queued * FULL_NUM + FULL_DEN - 1) / FULL_DEN) : 0;
	link_bound = max_queued > 0 ? max_queued / 2 : 0;
}

static void free_slow(struct slow *s)
{
	HASH_DEL(slow_clients, s);
	n_slow--;
	free(s->id);
	free(s);
}

/* The entry of a client near the bound, made if needed (NULL: no id, or too many tracked). */
static struct slow *slow_for(const char *id)
{
	struct slow *s;

	if(id == NULL) return NULL;
	HASH_FIND_STR(slow_clients, id, s);
	if(s != NULL || n_slow >= SLOW_MAX) return s;
	s = calloc(1, sizeof(*s));
	if(s == NULL) return NULL;
	s->id = xstrdup(id);
	if(s->id == NULL){
		free(s);
		return NULL;
	}
	HASH_ADD_KEYPTR(hh, slow_clients, s->id, strlen(s->id), s);
	n_slow++;
	return s;
}

static void reset_slow(const char *id)
{
	struct slow *s;

	if(id == NULL || n_slow == 0) return;
	HASH_FIND_STR(slow_clients, id, s);
	if(s != NULL) s->full_ms = s->held_ms = 0;
}

void inject_measure(struct mosquitto *client)
{
	struct slow *s;
	int queued;
	int64_t now;

	if(owed_head == NULL || !inflight_out_queued(client, &queued)) return;
	if(full_at <= 0 || queued < full_at){
		if(full_at > 0){
			if(n_room < 2 && (n_room == 0 || room[0] != client)) room[n_room++] = client;
			reset_slow(mosquitto_client_id(client));
		}
		if(queued > fullest) fullest = queued;
		return;
	}
	now = mono_ms();
	s = slow_for(mosquitto_client_id(client));
	if(s == NULL){
		if(queued > fullest) fullest = queued;
		return;
	}
	if(s->full_ms == 0){
		s->full_ms = now;
		s->held_ms = 0;
	}
	s->seen_ms = now;
	if(s->seen_iter != iteration && n_seen < SEEN_MAX){
		s->seen_iter = iteration;
		s->conn = client;
		seen[n_seen++] = s;
	}
	if(s->held_ms != 0 && now - s->held_ms >= LEAVE_OUT_MS){
		n_left_out++; /* it loses what overflows, as on one broker */
		if(fullest < 0) fullest = 0; /* measured: the others have room */
		return;
	}
	if(queued > fullest) fullest = queued;
}

void inject_forget(const char *id)
{
	reset_slow(id);
}

/* The end of an iteration: the clients near the bound that held back one with room; every
 * SWEEP_MS, the entries no longer near the bound or not measured for STALE_MS go. */
static void slow_tick(void)
{
	struct slow *s, *tmp;
	int64_t now;
	unsigned i;

	if(n_slow == 0 && n_seen == 0){
		n_room = 0;
		return;
	}
	now = mono_ms();
	for(i = 0; i < n_seen; i++){
		s = seen[i];
		if(s->full_ms != 0 && s->held_ms == 0
				&& (n_room == 2 || (n_room == 1 && room[0] != s->conn))){
			s->held_ms = now; /* another client with room got a message of these batches */
		}
	}
	n_seen = 0;
	n_room = 0;
	iteration++;
	if(now - last_sweep_ms < SWEEP_MS) return;
	last_sweep_ms = now;
	HASH_ITER(hh, slow_clients, s, tmp){
		if(s->full_ms == 0 || now - s->seen_ms > STALE_MS) free_slow(s);
	}
}

bool inject_take_queued(void)
{
	bool was = queued_now;

	queued_now = false;
	return was;
}

void inject_tick(void)
{
	struct owed *o, **link = &owed_head;
	char buf[200];
	int n;

	while((o = *link) != NULL){
		if(!o->routed){
			o->routed = true; /* routed at the top of the next iteration */
			link = &o->next;
			continue;
		}
		n = snprintf(buf, sizeof(buf), "{\"v\":1,\"cmd\":\"inject\",\"batch\":%llu,\"ok\":true,"
				"\"count\":%u,\"queued\":%d", (unsigned long long)o->id, o->count, fullest);
		if(n > 0 && n < (int)sizeof(buf)){ /* a link paces itself to the bound (room.c) */
			n += o->link ? snprintf(buf + n, sizeof(buf) - (size_t)n, ",\"bound\":%ld}",
					link_bound) : snprintf(buf + n, sizeof(buf) - (size_t)n, "}");
		}
		send_reply(o->to, o->qos, buf, n);
		*link = o->next;
		free(o->to);
		free(o);
	}
	owed_tail = link;
	fullest = -1;
	slow_tick();
}

static void free_prepared(struct prepared *m, unsigned n)
{
	unsigned i;

	for(i = 0; i < n; i++){
		free(m[i].topic);
		free(m[i].cut_client);
		mosquitto_property_free_all(&m[i].props);
	}
	free(m);
}

/* Check one record and prepare it; NULL on success, else the reason. */
/* A cut (kind 2): the session's client id, the origin node, the cut seq. */
static const char *prepare_cut(const struct mqfb_record *r, struct prepared *m)
{
	if(r->topic_len || r->props_len || r->payload_len) return "cut";
	if(r->client_len == 0 || memchr(r->client, 0, r->client_len) != NULL
			|| mosquitto_validate_utf8(r->client, r->client_len) != MOSQ_ERR_SUCCESS){
		return "client";
	}
	if(r->origin_len == 0) return "origin";
	m->cut = true;
	m->cut_client = malloc((size_t)r->client_len + 1);
	if(m->cut_client == NULL) return "memory";
	memcpy(m->cut_client, r->client, r->client_len);
	m->cut_client[r->client_len] = '\0';
	m->id.origin = r->origin;
	m->id.origin_len = r->origin_len;
	m->id.seq = r->seq;
	m->sent = r->hlc;
	return NULL;
}

static const char *prepare(const struct mqfb_record *r, struct prepared *m)
{
	if(r->kind == MQFB_KIND_CUT) return prepare_cut(r, m);
	if(r->kind != MQFB_KIND_MESSAGE) return "kind";
	if(r->topic_len == 0 || memchr(r->topic, 0, r->topic_len) != NULL) return "topic";
	if(mosquitto_validate_utf8(r->topic, r->topic_len) != MOSQ_ERR_SUCCESS) return "topic";
	if(r->client_len && mosquitto_validate_utf8(r->client, r->client_len) != MOSQ_ERR_SUCCESS){
		return "client";
	}
	if(r->payload_len > INT32_MAX) return "payload";
	m->topic = malloc((size_t)r->topic_len + 1);
	if(m->topic == NULL) return "memory";
	memcpy(m->topic, r->topic, r->topic_len);
	m->topic[r->topic_len] = '\0';
	if(mosquitto_pub_topic_check(m->topic) != MOSQ_ERR_SUCCESS) return "topic";
	m->payload = r->payload;
	m->payload_len = r->payload_len;
	m->qos = r->qos;
	m->retain = r->retain;
	m->id.publisher = r->client;
	m->id.publisher_len = r->client_len;
	m->id.origin = r->origin;
	m->id.origin_len = r->origin_len;
	m->id.seq = r->seq;
	return mqfb_props(r, &m->props);
}

void inject_on_control(const struct mosquitto_evt_control *ed)
{
	struct mqfb_batch b;
	struct mqfb_record r;
	struct prepared *m = NULL;
	const char *why;
	unsigned n = 0, i, count;
	int rc;

	bool link = linkin_conn(ed->client);
	uint64_t last_seq = 0, dups = 0;

	if(ed->client == NULL || (!link && ed->client != sidecar_conn()
				&& ed->client != sidecar_fwd_conn())){
		n_refused++; /* the ACL check already refuses this: never act on anyone else */
		return;
	}
	reply_to = mosquitto_client_id(ed->client);
	reply_qos = ed->client == sidecar_conn() ? 1 : 0;
	reply_link = link;
	why = mqfb_open(ed->payload, ed->payloadlen, &b);
	if(why == NULL && b.count > 0){
		m = calloc(b.count, sizeof(*m));
		if(m == NULL) why = "memory";
	}
	count = b.count;
	while(why == NULL && n < count){
		why = mqfb_next(&b, &r);
		if(why == NULL && link && (r.kind != MQFB_KIND_MESSAGE || r.origin_len == 0)){
			why = "link record"; /* a link carries messages naming their origin */
		}
		if(why == NULL) why = prepare(&r, &m[n]);
		n++; /* a half-prepared record is freed with the rest */
	}
	if(why == NULL && b.left != 0) why = "trailing";
	if(why){
		n_refused++;
		mosquitto_log_printf(MOSQ_LOG_WARNING, "mqfed: refusing an inject batch (%s at record %u)",
				why, n ? n - 1 : 0);
		reply(b.id, why, 0, n ? n - 1 : 0);
		free_prepared(m, n);
		return;
	}
	for(i = 0; i < n; i++){
		if(link && !linkin_fresh(ed->client, m[i].id.seq)){
			dups++; /* injected before: its batch came again after a reconnect */
			continue;
		}
		if(link) last_seq = m[i].id.seq;
		if(m[i].cut){
			cut_arrived(m[i].cut_client, cut_origin_hash(m[i].id.origin, m[i].id.origin_len),
					m[i].id.seq, (int64_t)(m[i].sent >> 16));
			continue;
		}
		origin_injected(m[i].topic, m[i].payload, m[i].payload_len, m[i].qos, m[i].props,
				&m[i].id);
		rc = mosquitto_broker_publish_copy(NULL, m[i].topic, (int)m[i].payload_len,
				m[i].payload, m[i].qos, m[i].retain, m[i].props);
		if(rc != MOSQ_ERR_SUCCESS){
			/* out of memory: the sidecar sends the batch again (those before i twice) */
			mosquitto_log_printf(MOSQ_LOG_ERR, "mqfed: injecting a message failed (%d)", rc);
			if(link && i > 0) linkin_injected(ed->client, m[i - 1].id.seq, dups);
			n_messages += i;
			reply(b.id, "memory", 0, i);
			free_prepared(m, n);
			return;
		}
		m[i].props = NULL; /* Mosquitto owns them now */
		queued_now = true;
	}
	n_batches++;
	n_messages += n - dups;
	if(link) linkin_injected(ed->client, last_seq, dups);
	reply(b.id, NULL, n, 0);
	free_prepared(m, n);
}

void inject_stats(struct inject_stats *s)
{
	s->batches = n_batches;
	s->messages = n_messages;
	s->refused = n_refused;
	s->left_out = n_left_out;
	s->slow_clients = n_slow;
}

void inject_cleanup(void)
{
	struct owed *o;
	struct slow *s, *tmp;

	while((o = owed_head) != NULL){
		owed_head = o->next;
		free(o->to);
		free(o);
	}
	owed_tail = &owed_head;
	fullest = -1;
	link_bound = 0;
	reply_link = false;
	n_batches = n_messages = n_refused = 0;
	queued_now = false;
	HASH_ITER(hh, slow_clients, s, tmp) free_slow(s);
	n_seen = 0;
	n_room = 0;
	iteration = 1;
	full_at = 0;
	last_sweep_ms = 0;
	n_left_out = 0;
}
