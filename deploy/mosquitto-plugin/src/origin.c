/* Messages re-injected by the sidecar's forwarding connection (`<sidecar_id>.fwd`) are never
 * delivered to a shared subscription: the node where the message was published already gave it
 * to exactly one member of each group, cluster-wide. Plain subscriptions get them as usual (with
 * the rest of the ACL chain deciding), everything else is routed exactly as before.
 * Contract: docs/plugin-protocol.md, "Re-injected messages and shared subscriptions".
 *
 * Mosquitto 2.0.11 (Debian 2.0.11-1.2+deb12u2) gives a READ check (`MOSQ_ACL_READ`) neither the
 * publisher nor the kind of subscription. Both are reconstructed, from these facts of its source:
 *
 *  1. Identity of the routed message. subs__send() (subs.c) checks
 *     mosquitto_acl_check(leaf->context, topic, stored->payloadlen, stored->payload,
 *     stored->qos, stored->retain, MOSQ_ACL_READ) where `topic` is stored->topic (every caller of
 *     sub__messages_queue passes the store's own topic: handle_publish.c, database.c
 *     db__message_release_incoming and db__messages_easy_queue). plugin__handle_message()
 *     (plugin.c) gives the MESSAGE callback stored->topic and stored->payload of the very msg
 *     that handle__publish then stores and routes. So MESSAGE and READ see the same two pointers.
 *     A pointer identifies a message only while that message is alive (after its free another
 *     allocation may get the address), so an identity is also checked against a hash of the
 *     topic and payload contents, and is forgotten as soon as its message may be gone.
 *
 *  2. QoS 0 and 1 (handle_publish.c): the WRITE check, then plugin__handle_message() (our MESSAGE
 *     callback), then db__message_store() and sub__messages_queue() at once, with no plugin
 *     callback in between. So the message of the last MESSAGE callback of .fwd is the one being
 *     routed until any other callback runs. `fwd_cur` is set there and cleared by every other
 *     callback (origin_event). What can route without a callback of ours after it: wills (always
 *     preceded by the will's WRITE check in context__send_will, and by DISCONNECT in
 *     context__disconnect), retained messages at SUBSCRIBE (preceded by the SUBSCRIBE check),
 *     plugin and $SYS messages (the loop's TICK comes first), a PUBREL of another client (a
 *     message allocated at its own PUBLISH, while ours was alive: another address), $SYS log and
 *     bridge notification messages (other topics: the hash differs).
 *
 *  3. QoS 2: handle__publish only stores the message in .fwd's incoming queue and sends PUBREC;
 *     handle__pubrel -> db__message_release_incoming -> sub__messages_queue routes it later with
 *     no callback of ours. Its store is alive, referenced by .fwd's session, until that routing,
 *     so its topic pointer is unique until then. Each such message is kept in `fwd_q2` (keyed
 *     by topic pointer) and forgotten: after its routing (a READ check matched it: dropped at the
 *     next callback, routings are synchronous), when any MESSAGE callback sees its topic pointer
 *     on a new message (the old one is freed), when .fwd's session ends (clean start, expiry 0,
 *     or its expiry passes while offline), after Q2_MAX_AGE_MS, or beyond `fwd_qos2_max` entries
 *     (oldest first). Forgetting too early only means the old behaviour (a shared member gets
 *     it); the hash check guards the rest.
 *
 *  4. Plain before shared (subs.c): sub__messages_queue() searches db.normal_subs completely,
 *     then db.shared_subs; sub__add() puts `$share/...` filters only in the shared tree. One READ
 *     check per matching plain subscription of a client (No Local skips only the publisher's own
 *     subscriptions, and the publisher is .fwd), then one per group in which it is the member at
 *     the head. So for a client with P matching plain and S > 0 matching shared subscriptions
 *     (the plugin's model), the first P checks of that routing are plain (allowed as usual) and
 *     every later one is shared (denied). A client with S == 0 is never touched.
 *
 * .fwd itself: its plain subscriptions have No Local, so Mosquitto never checks them for its own
 * messages; any READ check on .fwd (live or offline session) for its own message is a shared
 * membership (No Local is forbidden there): denied.
 *
 * The forwarding shards (`.fwd<k>`, sidecar.c): more connections holding forwarding
 * subscriptions, never publishing. No Local is about the publisher's own subscriptions, so it
 * does not keep .fwd's re-injections away from them: every READ check on a shard (live or
 * offline session) for a message of .fwd is denied here, plain or shared, whatever its QoS
 * (QoS 2: at its PUBREL, by the `fwd_q2` entry), or the message would be forwarded back to the
 * peers (a loop). Failing open here (an entry forgotten early: cap, age) means one such copy:
 * the sidecar forwards it once (as a new message of this node), so that is a duplicate, not a
 * loop, unless it fails open again on the other side.
 *
 * Publishes of .fwd with retain=1 (replicated retained messages) are covered too: their routing
 * is the same. Later deliveries of the stored retained message are untouched: each follows a
 * SUBSCRIBE check (which clears `fwd_cur`, and a QoS 2 entry was dropped after its routing or
 * is checked with the client's fresh count, where the new plain subscription comes first), and
 * Mosquitto sends no retained message to a shared subscription. */
#include <stdlib.h>
#include <string.h>

#include "calib.h"
#include "cut.h"
#include "model.h"
#include "origin.h"
#include "sidecar.h"

#define Q2_MAX_AGE_MS 60000

/* A message as plugin callbacks see it. Mosquitto passes the MESSAGE callback and every READ
 * check of a routed message the same msg-store topic and payload pointers. */
struct fwd_fp {
	const char *topic;         /* identity only while the message lives */
	const void *payload;       /* NULL for an empty payload */
	uint32_t len;
	uint8_t qos;
	uint64_t hash;             /* of the topic and payload contents */
	mosquitto_property *props; /* a copy, kept only while a ring hold exists (hold.c) */
};

/* A QoS 2 message published by the forwarding connection, routed later at its PUBREL. */
struct fwd_q2 {
	UT_hash_handle hh;         /* keyed by fp.topic (pointer) */
	struct fwd_fp fp;
	int64_t born_ms;
	bool hit;                  /* a READ check of its routing was seen */
	struct fwd_q2 *next_hit;
};

static uint64_t fwd_q2_max;       /* option fwd_qos2_max */
static uint64_t hash_seed;
static uint64_t run_seq;          /* bumped by every callback other than a READ check */
static bool fwd_cur_set;          /* a QoS 0/1 message of .fwd: routed before the next callback */
static struct fwd_fp fwd_cur;
static struct fwd_q2 *fwd_q2;     /* QoS 2 messages of .fwd awaiting PUBREL, oldest first */
static struct fwd_q2 *fwd_hits;   /* entries whose routing ran: dropped at the next callback */
static time_t fwd_drop_at;        /* .fwd offline with a session: forget all entries at this time */
static uint64_t fwd_denied;       /* deliveries to shared subscriptions refused */
static uint64_t fwd_q2_evicted;   /* entries forgotten before their routing (cap, age, session) */
static bool keep_props;           /* copy the messages' properties (a ring hold exists) */

/* Whether the properties of .fwd's messages are kept for origin_routed_props (hold.c: while a
 * replica's ring hold exists). */
void origin_keep_props(bool on)
{
	keep_props = on;
}

/* Messages injected by inject.c (a batch on `$CONTROL/mqfed/inject`). mosquitto_broker_publish
 * appends them to db.plugin_msgs; queue_plugin_msgs (loop.c) routes that list, in order and
 * without a client, at the top of the next loop iteration, right after the TICK
 * (plugin__handle_tick ends each iteration) and with no callback of ours but their READ checks
 * in between. db__messages_easy_queue copies the payload, so a check is matched by the hash of
 * topic and payload (and length, QoS) against this FIFO from its head; a record whose routing
 * made no check (no subscriber) is passed over. QUEUED until the TICK, ARMED after it, cleared
 * by the next other callback (origin_event). */
enum { INJ_NONE, INJ_QUEUED, INJ_ARMED };
struct inj_fp {
	uint64_t hash;
	uint32_t len;
	uint8_t qos;
	mosquitto_property *props;   /* a copy, while a ring hold exists (origin_routed_props) */
	uint64_t publisher;          /* hash of its publisher's client id; 0: none named */
	uint16_t publisher_len;
	uint64_t origin;             /* cut_origin_hash() of its origin node; 0: none named */
	uint64_t seq;                /* its seq there */
};
static struct inj_fp *inj;
static size_t inj_n, inj_cap, inj_head;
static int inj_state;
static bool inj_cur_set;          /* inj_cur_*: the store of the injected message being routed */
static const char *inj_cur_topic;
static const void *inj_cur_payload;
static bool last_injected;        /* the last READ check was of an injected message */
static uint64_t no_local_denied;

static void inj_clear(void)
{
	size_t k;

	for(k = 0; k < inj_n; k++) mosquitto_property_free_all(&inj[k].props);
	inj_n = inj_head = 0;
	inj_state = INJ_NONE;
	inj_cur_set = false;
}

void origin_init(uint64_t q2_max, uint64_t seed)
{
	fwd_q2_max = q2_max;
	hash_seed = seed;
}

static uint64_t fp_hash(const char *topic, const void *payload, uint32_t len)
{
	uint64_t h = hash_bytes(hash_seed, topic, strlen(topic));

	return hash_bytes(h, payload, payload ? len : 0);
}

static void q2_del(struct fwd_q2 *e)
{
	struct fwd_q2 **pp;

	if(e->hit){
		for(pp = &fwd_hits; *pp; pp = &(*pp)->next_hit){
			if(*pp == e){
				*pp = e->next_hit;
				break;
			}
		}
	}
	HASH_DEL(fwd_q2, e);
	mosquitto_property_free_all(&e->fp.props);
	free(e);
}

static void q2_forget(struct fwd_q2 *e)
{
	if(!e->hit) fwd_q2_evicted++;
	q2_del(e);
}

static void q2_forget_all(void)
{
	struct fwd_q2 *e, *tmp;

	HASH_ITER(hh, fwd_q2, e, tmp){
		q2_forget(e);
	}
	fwd_hits = NULL;
}

void origin_stats(struct origin_stats *s)
{
	s->denied = fwd_denied;
	s->tracked = HASH_COUNT(fwd_q2);
	s->forgotten = fwd_q2_evicted;
	s->no_local = no_local_denied;
}

/* Any plugin callback other than a READ check: no routing of an earlier message is running. */
void origin_event(void)
{
	struct fwd_q2 *e;

	run_seq++;
	fwd_cur_set = false;
	mosquitto_property_free_all(&fwd_cur.props);
	if(inj_state == INJ_ARMED) inj_clear();
	while(fwd_hits){
		e = fwd_hits;
		fwd_hits = e->next_hit;
		e->hit = false; /* already off the hit list */
		HASH_DEL(fwd_q2, e);
		mosquitto_property_free_all(&e->fp.props);
		free(e);
	}
}

/* Changes at every callback other than a READ check (recent.c: which routing is running). */
uint64_t origin_run_seq(void)
{
	return run_seq;
}

void origin_on_message(const struct mosquitto_evt_message *ed)
{
	struct fwd_q2 *e = NULL;
	struct fwd_fp fp;

	origin_event();
	if(ed->topic == NULL) return;
	if(fwd_q2){
		/* This live message has that topic pointer: the entry's message was freed. */
		HASH_FIND_PTR(fwd_q2, &ed->topic, e);
		if(e) q2_forget(e);
	}
	if(sidecar_fwd_conn() == NULL || ed->client != sidecar_fwd_conn()) return;

	fp.topic = ed->topic;
	fp.payload = ed->payload;
	fp.len = ed->payloadlen;
	fp.qos = ed->qos;
	fp.hash = fp_hash(ed->topic, ed->payload, ed->payloadlen);
	fp.props = NULL;
	/* a replica's ring keeps the properties of what it refuses (hold.c); on failure it keeps
	 * the message without them */
	if(ed->properties && keep_props
			&& mosquitto_property_copy_all(&fp.props, ed->properties) != MOSQ_ERR_SUCCESS){
		mosquitto_property_free_all(&fp.props);
	}
	if(ed->qos < 2){
		fwd_cur = fp;
		fwd_cur_set = true;
		return;
	}
	while(fwd_q2 && HASH_COUNT(fwd_q2) >= fwd_q2_max){
		q2_forget(fwd_q2); /* the oldest */
	}
	e = calloc(1, sizeof(*e));
	if(e == NULL){
		mosquitto_property_free_all(&fp.props);
		return; /* fail open: routed as before */
	}
	e->fp = fp;
	e->born_ms = mono_ms();
	HASH_ADD_PTR(fwd_q2, fp.topic, e);
}

static bool fp_matches(const struct fwd_fp *fp, const char *topic, const void *payload,
		uint32_t len, uint8_t qos)
{
	return fp->topic == topic && fp->payload == payload && fp->len == len && fp->qos == qos
		&& fp->hash == fp_hash(topic, payload, len);
}

/* Count the client's subscriptions matching the topic, plain and shared (once per routing). */
static void run_start(struct client *c, struct client_run *r, const char *topic)
{
	r->seq = run_seq;
	r->topic = topic;
	r->checks = 0;
	model_count_matches(c, topic, &r->plain, &r->shared);
}

/* Whether this READ check of `client` is for one of its shared subscriptions (fact 4 above:
 * its matching plain subscriptions are checked first, then once per group in which it is the
 * member at the head), counted per routing (run_seq, topic pointer) for a client with shared
 * subscriptions in the model. Called once for every READ check. */
bool origin_shared_check(struct mosquitto *client, const char *topic)
{
	struct client *c;
	struct client_run *r;

	if(topic == NULL || model_shared_subscriptions() == 0) return false; /* (no lookup) */
	c = model_find(mosquitto_client_id(client));
	if(c == NULL || model_client_shared(c) == 0) return false;
	r = model_client_run(c);
	if(r->seq != run_seq || r->topic != topic) run_start(c, r, topic);
	if(r->shared == 0) return false;
	return ++r->checks > r->plain;
}

/* The message of .fwd whose store's topic pointer this READ check carries (its QoS 2 entry in
 * `*entry`), or NULL; its contents are not compared yet (fp_matches). */
static const struct fwd_fp *fwd_routed(const char *topic, uint8_t qos, struct fwd_q2 **entry)
{
	struct fwd_q2 *e = NULL;

	*entry = NULL;
	if(fwd_cur_set && topic == fwd_cur.topic) return &fwd_cur;
	if(qos != 2 || fwd_q2 == NULL) return NULL;
	HASH_FIND_PTR(fwd_q2, &topic, e);
	*entry = e;
	return e ? &e->fp : NULL;
}

/* The properties of the forwarding connection's message this READ check routes (NULL: none,
 * not one of its messages, or no ring hold existed at its MESSAGE callback). */
const mosquitto_property *origin_routed_props(const char *topic, const void *payload,
		uint32_t len, uint8_t qos)
{
	struct fwd_q2 *e;
	const struct fwd_fp *fp;

	if(topic && last_injected && inj_cur_set && topic == inj_cur_topic
			&& payload == inj_cur_payload && inj_head > 0){
		return inj[inj_head - 1].props; /* an injected message (injected_routing) */
	}
	fp = topic ? fwd_routed(topic, qos, &e) : NULL;
	return fp && fp_matches(fp, topic, payload, len, qos) ? fp->props : NULL;
}

/* The origin (cut_origin_hash) and seq of the message of the last READ check, if it was an
 * injected one whose record named its origin. */
bool origin_read_identity(uint64_t *origin, uint64_t *seq)
{
	const struct inj_fp *e;

	if(!last_injected || inj_head == 0) return false;
	e = &inj[inj_head - 1];
	if(e->origin == 0) return false;
	*origin = e->origin;
	*seq = e->seq;
	return true;
}

void origin_injected(const char *topic, const void *payload, uint32_t payloadlen, uint8_t qos,
		const mosquitto_property *props, const struct injected_id *id)
{
	struct inj_fp *grown;

	if(inj_n == inj_cap){
		grown = realloc(inj, (inj_cap ? inj_cap * 2 : 64) * sizeof(*inj));
		if(grown == NULL) return; /* fail open: a shared member may get it (a duplicate) */
		inj = grown;
		inj_cap = inj_cap ? inj_cap * 2 : 64;
	}
	inj[inj_n].hash = fp_hash(topic, payload, payloadlen);
	inj[inj_n].len = payloadlen;
	inj[inj_n].qos = qos;
	inj[inj_n].props = NULL;
	inj[inj_n].publisher_len = id->publisher_len;
	inj[inj_n].publisher = id->publisher_len
		? hash_bytes(hash_seed, id->publisher, id->publisher_len) : 0;
	inj[inj_n].origin = id->origin_len ? cut_origin_hash(id->origin, id->origin_len) : 0;
	inj[inj_n].seq = id->seq;
	/* a replica's ring keeps the properties of what it refuses (hold.c); on failure it keeps
	 * the message without them */
	if(props && keep_props
			&& mosquitto_property_copy_all(&inj[inj_n].props, props) != MOSQ_ERR_SUCCESS){
		mosquitto_property_free_all(&inj[inj_n].props);
	}
	inj_n++;
	inj_state = INJ_QUEUED;
}

/* Whether the last READ check (origin_read_denied) was of an injected message. */
bool origin_read_injected(void)
{
	return last_injected;
}

/* Is this READ check's message one of the injected ones being routed? */
static bool injected_routing(const char *topic, const void *payload, uint32_t len, uint8_t qos)
{
	uint64_t h;
	size_t k;

	if(inj_state != INJ_ARMED) return false;
	if(inj_cur_set && topic == inj_cur_topic && payload == inj_cur_payload) return true;
	inj_cur_set = false;
	h = fp_hash(topic, payload, len);
	for(k = inj_head; k < inj_n; k++){
		if(inj[k].hash == h && inj[k].len == len && inj[k].qos == qos) break;
	}
	if(k == inj_n) return false;
	inj_head = k + 1;
	inj_cur_set = true;
	inj_cur_topic = topic;
	inj_cur_payload = payload;
	return true;
}

/* Whether the injected message being routed (inj[inj_head - 1]) was published by `client`
 * on its node, and every plain subscription of `client` it matches has No Local: Mosquitto
 * routes it with no client, so its own No Local cannot apply (a session's copy or replica
 * here gets the client's own messages from where it is connected now). With plain
 * subscriptions without No Local too, the check cannot tell which one it is for: allowed. */
static bool own_message(struct mosquitto *client, const char *topic)
{
	const struct inj_fp *e = &inj[inj_head - 1];
	const char *id;
	struct client *c;
	size_t len;

	if(e->publisher_len == 0) return false;
	id = mosquitto_client_id(client);
	if(id == NULL) return false;
	len = strlen(id);
	if(len != e->publisher_len || hash_bytes(hash_seed, id, len) != e->publisher) return false;
	c = model_find(id);
	return c != NULL && model_plain_matches_all_no_local(c, topic);
}

bool origin_read_denied(struct mosquitto *client, const char *topic, const void *payload,
		uint32_t payloadlen, uint8_t qos, bool retain, bool shared_check)
{
	const struct fwd_fp *fp;
	struct fwd_q2 *e;
	bool to_fwd;

	(void)retain;
	last_injected = false;
	if(topic == NULL) return false;
	if(injected_routing(topic, payload, payloadlen, qos)){
		last_injected = true;
		/* routed with no client, so No Local cannot keep it from the forwarding connections
		 * (a loop): refused there, and to shared subscriptions, like .fwd's re-injections */
		if(!sidecar_is_fwd(client) && !shared_check){
			if(!own_message(client, topic)) return false;
			no_local_denied++;
			return true;
		}
		fwd_denied++;
		return true;
	}
	fp = fwd_routed(topic, qos, &e);
	if(fp == NULL) return false;
	if(e && !e->hit){
		/* its routing is running (or the entry is stale): forget it at the next callback */
		e->hit = true;
		e->next_hit = fwd_hits;
		fwd_hits = e;
	}

	to_fwd = sidecar_is_fwd(client);
	if(!to_fwd && !shared_check) return false; /* a plain subscription: routed as usual */
	if(!fp_matches(fp, topic, payload, payloadlen, qos)) return false;
	fwd_denied++;
	return true;
}

/* The forwarding connection authenticated. */
void origin_fwd_auth(struct mosquitto *client)
{
	if(mosquitto_client_clean_session(client)
			|| (fwd_drop_at != 0 && time(NULL) >= fwd_drop_at)){
		q2_forget_all(); /* its old session and its pending QoS 2 messages are gone */
	}
	fwd_drop_at = 0;
}

/* The live forwarding connection goes away. */
void origin_fwd_disconnect(struct mosquitto *client)
{
	int64_t expiry = client_expiry(client);

	if(expiry <= 0){
		q2_forget_all(); /* expiry 0: the session ends now; unknown: fail open */
	}else if(expiry < EXPIRY_NEVER){
		fwd_drop_at = time(NULL) + (time_t)expiry;
	}
}

void origin_tick(void)
{
	int64_t now = mono_ms();

	if(inj_state == INJ_QUEUED) inj_state = INJ_ARMED; /* routed right after this TICK */

	if(sidecar_fwd_conn() == NULL && fwd_drop_at != 0 && time(NULL) >= fwd_drop_at){
		q2_forget_all();
		fwd_drop_at = 0;
	}
	while(fwd_q2 && (now - fwd_q2->born_ms > Q2_MAX_AGE_MS || now < fwd_q2->born_ms)){
		q2_forget(fwd_q2);
	}
}

void origin_cleanup(void)
{
	struct fwd_q2 *e, *tmp;

	HASH_ITER(hh, fwd_q2, e, tmp){
		HASH_DEL(fwd_q2, e);
		mosquitto_property_free_all(&e->fp.props);
		free(e);
	}
	mosquitto_property_free_all(&fwd_cur.props);
	fwd_q2_max = hash_seed = run_seq = fwd_denied = fwd_q2_evicted = no_local_denied = 0;
	fwd_cur_set = false;
	keep_props = false;
	memset(&fwd_cur, 0, sizeof(fwd_cur));
	fwd_q2 = NULL;
	fwd_hits = NULL;
	fwd_drop_at = 0;
	inj_clear();
	free(inj);
	inj = NULL;
	inj_cap = 0;
}
