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
 *     routed until any other callback runs. `g.fwd_cur` is set there and cleared by every other
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
 *     so its topic pointer is unique until then. Each such message is kept in `g.fwd_q2` (keyed
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
 * Publishes of .fwd with retain=1 (replicated retained messages) are covered too: their routing
 * is the same. Later deliveries of the stored retained message are untouched: each follows a
 * SUBSCRIBE check (which clears `g.fwd_cur`, and a QoS 2 entry was dropped after its routing or
 * is checked with the client's fresh count, where the new plain subscription comes first), and
 * Mosquitto sends no retained message to a shared subscription. */
#include <stdlib.h>
#include <string.h>

#include "mqfed.h"

#define Q2_MAX_AGE_MS 60000

static uint64_t fp_hash(const char *topic, const void *payload, uint32_t len)
{
	uint64_t h = hash_bytes(g.hash_seed, topic, strlen(topic));

	return hash_bytes(h, payload, payload ? len : 0);
}

static void q2_del(struct fwd_q2 *e)
{
	struct fwd_q2 **pp;

	if(e->hit){
		for(pp = &g.fwd_hits; *pp; pp = &(*pp)->next_hit){
			if(*pp == e){
				*pp = e->next_hit;
				break;
			}
		}
	}
	HASH_DEL(g.fwd_q2, e);
	free(e);
}

static void q2_forget(struct fwd_q2 *e)
{
	if(!e->hit) g.fwd_q2_evicted++;
	q2_del(e);
}

static void q2_forget_all(void)
{
	struct fwd_q2 *e, *tmp;

	HASH_ITER(hh, g.fwd_q2, e, tmp){
		q2_forget(e);
	}
	g.fwd_hits = NULL;
}

unsigned origin_tracked(void)
{
	return HASH_COUNT(g.fwd_q2);
}

/* Any plugin callback other than a READ check: no routing of an earlier message is running. */
void origin_event(void)
{
	struct fwd_q2 *e;

	g.run_seq++;
	g.fwd_cur_set = false;
	while(g.fwd_hits){
		e = g.fwd_hits;
		g.fwd_hits = e->next_hit;
		e->hit = false; /* already off the hit list */
		HASH_DEL(g.fwd_q2, e);
		free(e);
	}
}

void origin_on_message(const struct mosquitto_evt_message *ed)
{
	struct fwd_q2 *e = NULL;
	struct fwd_fp fp;

	origin_event();
	if(ed->topic == NULL) return;
	if(g.fwd_q2){
		/* This live message has that topic pointer: the entry's message was freed. */
		HASH_FIND_PTR(g.fwd_q2, &ed->topic, e);
		if(e) q2_forget(e);
	}
	if(g.fwd == NULL || ed->client != g.fwd) return;

	fp.topic = ed->topic;
	fp.payload = ed->payload;
	fp.len = ed->payloadlen;
	fp.qos = ed->qos;
	fp.hash = fp_hash(ed->topic, ed->payload, ed->payloadlen);
	if(ed->qos < 2){
		g.fwd_cur = fp;
		g.fwd_cur_set = true;
		return;
	}
	while(g.fwd_q2 && HASH_COUNT(g.fwd_q2) >= g.fwd_q2_max){
		q2_forget(g.fwd_q2); /* the oldest */
	}
	e = calloc(1, sizeof(*e));
	if(e == NULL) return; /* fail open: routed as before */
	e->fp = fp;
	e->born_ms = now_ms();
	HASH_ADD_PTR(g.fwd_q2, fp.topic, e);
}

static bool fp_matches(const struct fwd_fp *fp, const char *topic, const void *payload,
		uint32_t len, uint8_t qos)
{
	return fp->topic == topic && fp->payload == payload && fp->len == len && fp->qos == qos
		&& fp->hash == fp_hash(topic, payload, len);
}

/* Count the client's subscriptions matching the topic, plain and shared (once per routing). */
static void run_start(struct client *c, const char *topic)
{
	struct sub *s, *tmp;

	c->run_seq = g.run_seq;
	c->run_topic = topic;
	c->run_checks = 0;
	c->run_plain = 0;
	c->run_shared = 0;
	HASH_ITER(hh, c->subs, s, tmp){
		const char *f = strip_share(s->filter);
		bool shared = strncmp(s->filter, "$share/", 7) == 0;
		bool match = false;

		if(shared && f == s->filter) continue; /* "$share/<group>" without a filter */
		if(mosquitto_topic_matches_sub(f, topic, &match) != MOSQ_ERR_SUCCESS || !match) continue;
		if(shared){
			c->run_shared++;
		}else{
			c->run_plain++;
		}
	}
}

bool origin_read_denied(struct mosquitto *client, const char *topic, const void *payload,
		uint32_t payloadlen, uint8_t qos, bool retain)
{
	const struct fwd_fp *fp = NULL;
	struct fwd_q2 *e = NULL;
	struct client *c = NULL;
	const char *id;
	bool to_fwd;

	(void)retain;
	if(topic == NULL) return false;
	if(g.fwd_cur_set && topic == g.fwd_cur.topic){
		fp = &g.fwd_cur;
	}else if(qos == 2 && g.fwd_q2){
		HASH_FIND_PTR(g.fwd_q2, &topic, e);
		if(e == NULL) return false;
		fp = &e->fp;
		if(!e->hit){
			/* its routing is running (or the entry is stale): forget it at the next callback */
			e->hit = true;
			e->next_hit = g.fwd_hits;
			g.fwd_hits = e;
		}
	}else{
		return false;
	}

	id = mosquitto_client_id(client);
	to_fwd = client == g.fwd || streq(id, g.fwd_id);
	if(!to_fwd){
		c = model_find(id);
		if(c == NULL || c->shared_count == 0) return false; /* only plain subscriptions */
	}
	if(!fp_matches(fp, topic, payload, payloadlen, qos)) return false;
	if(!to_fwd){
		if(c->run_seq != g.run_seq || c->run_topic != topic) run_start(c, topic);
		if(c->run_shared == 0) return false;
		if(++c->run_checks <= c->run_plain) return false; /* its plain subscriptions come first */
	}
	g.fwd_denied++;
	return true;
}

/* The forwarding connection authenticated. */
void origin_fwd_auth(struct mosquitto *client)
{
	if(mosquitto_client_clean_session(client)
			|| (g.fwd_drop_at != 0 && time(NULL) >= g.fwd_drop_at)){
		q2_forget_all(); /* its old session and its pending QoS 2 messages are gone */
	}
	g.fwd_drop_at = 0;
}

/* The live forwarding connection goes away. */
void origin_fwd_disconnect(struct mosquitto *client)
{
	int64_t expiry = client_expiry(client);

	if(expiry <= 0){
		q2_forget_all(); /* expiry 0: the session ends now; unknown: fail open */
	}else if(expiry < EXPIRY_NEVER){
		g.fwd_drop_at = time(NULL) + (time_t)expiry;
	}
}

void origin_tick(void)
{
	int64_t now = now_ms();

	if(g.fwd == NULL && g.fwd_drop_at != 0 && time(NULL) >= g.fwd_drop_at){
		q2_forget_all();
		g.fwd_drop_at = 0;
	}
	while(g.fwd_q2 && (now - g.fwd_q2->born_ms > Q2_MAX_AGE_MS || now < g.fwd_q2->born_ms)){
		q2_forget(g.fwd_q2);
	}
}

void origin_cleanup(void)
{
	struct fwd_q2 *e, *tmp;

	HASH_ITER(hh, g.fwd_q2, e, tmp){
		HASH_DEL(g.fwd_q2, e);
		free(e);
	}
	g.fwd_hits = NULL;
}
