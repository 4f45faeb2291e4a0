/* The plugin's own model of clients, sessions and subscriptions.
 *
 * Every change of the model goes through one of the emit_* / model_* functions below, which
 * change the model AND emit the matching event in the same step. So the model always equals
 * "every event emitted so far", which is what makes a snapshot a consistent cut.
 *
 * Connections are "pending" between our BASIC_AUTH callback and the moment we know every
 * provider accepted them: the next TICK, any later event of that connection, any command, or
 * its DISCONNECT (client id still set = accepted; id NULL = a later provider refused it, since
 * handle_connect.c frees the id before disconnecting a refused client). */
#include <stdlib.h>
#include <string.h>

#include "calib.h"
#include "events.h"
#include "inflight.h"
#include "model.h"
#include "sidecar.h"
#include "will.h"

struct sub {
	UT_hash_handle hh;
	char *filter;
	uint8_t qos;
	uint8_t options;      /* No Local (bit 2), Retain As Published (bit 3), as last reported */
	uint32_t sub_id;      /* subscription identifier as last reported (0: none) */
};

struct client {
	UT_hash_handle hh; /* keyed by id */
	char *id;
	char *username;
	int protocol;              /* 3, 4 or 5 */
	bool clean_start;
	int64_t expiry;            /* session expiry interval (s), EXPIRY_UNKNOWN if not known */
	int keepalive;
	bool online;
	struct mosquitto *conn;    /* valid only while online */
	time_t expire_at;          /* offline with a finite known expiry: wall clock second; else 0 */
	struct sub *subs;
	unsigned sub_count;
	unsigned shared_count;     /* of which $share/<group>/... */
	struct client_run run;     /* origin.c's */
	uint32_t queued;           /* offline: messages routed to its session since it was online */
	int64_t connect_ms;        /* the client's own last connect here, wall clock (0: none) */
};

/* A connection that passed our BASIC_AUTH callback; later providers may still refuse it. */
struct pending {
	UT_hash_handle hh; /* keyed by conn pointer */
	struct mosquitto *conn;
	char *id;
	char *username;
	bool clean_start;
	bool have_old_expiry;      /* expiry of the live connection it is about to take over */
	int64_t old_expiry;
	uint64_t order;            /* resolution order */
	int64_t at_ms;             /* when it passed BASIC_AUTH (its CONNACK follows at once) */
};

/* Told of every client's accepted connect (not the sidecar's): plugin.c sets hold.c's. */
static void (*on_client_connect)(const char *id);

void model_set_connect_listener(void (*fn)(const char *id))
{
	on_client_connect = fn;
}

static struct client *clients;
static unsigned n_online;
static uint64_t n_subs;
static uint64_t n_shared; /* of which $share/<group>/..., over every client */
static struct pending *pendings;
static uint64_t pending_order;
/* the connection being kicked (model_kick) */
static struct mosquitto *kicking;

static void pending_drop(struct pending *p);

static const char *proto_name(int p)
{
	switch(p){
		case 3: return "mqtt31";
		case 4: return "mqtt311";
		case 5: return "mqtt5";
		default: return "unknown";
	}
}

struct client *model_find(const char *id)
{
	struct client *c = NULL;

	if(id == NULL) return NULL;
	HASH_FIND_STR(clients, id, c);
	return c;
}

/* Iteration in insertion order: model_next(NULL) is the first. */
struct client *model_next(struct client *c)
{
	return c ? c->hh.next : clients;
}

unsigned model_sessions(void)
{
	return HASH_COUNT(clients);
}

unsigned model_online(void)
{
	return n_online;
}

uint64_t model_subscriptions(void)
{
	return n_subs;
}

uint64_t model_shared_subscriptions(void)
{
	return n_shared;
}

const char *model_client_id(const struct client *c)
{
	return c->id;
}

bool model_client_online(const struct client *c)
{
	return c->online;
}

int64_t model_client_connect_ms(const struct client *c)
{
	return c->connect_ms;
}

/* Its live connection; NULL while offline. */
struct mosquitto *model_client_conn(const struct client *c)
{
	return c->online ? c->conn : NULL;
}

bool model_client_has_sub(struct client *c, const char *filter)
{
	struct sub *s = NULL;

	HASH_FIND_STR(c->subs, filter, s);
	return s != NULL;
}

int model_sub_qos(struct client *c, const char *filter)
{
	struct sub *s = NULL;

	HASH_FIND_STR(c->subs, filter, s);
	return s ? s->qos : -1;
}

uint32_t model_sub_identifier(struct client *c, const char *filter)
{
	struct sub *s = NULL;

	HASH_FIND_STR(c->subs, filter, s);
	return s ? s->sub_id : 0;
}

unsigned model_client_shared(const struct client *c)
{
	return c->shared_count;
}

/* Count the client's subscriptions matching the topic, plain and shared; `last_plain`, if not
 * NULL, gets the last plain one found. */
static void match_subs(struct client *c, const char *topic, unsigned *plain, unsigned *shared,
		struct sub **last_plain)
{
	struct sub *s, *tmp;

	*plain = 0;
	*shared = 0;
	HASH_ITER(hh, c->subs, s, tmp){
		const char *f = strip_share(s->filter);
		bool is_shared = strncmp(s->filter, "$share/", 7) == 0;
		bool match = false;

		if(is_shared && f == s->filter) continue; /* "$share/<group>" without a filter */
		if(mosquitto_topic_matches_sub(f, topic, &match) != MOSQ_ERR_SUCCESS || !match) continue;
		if(is_shared){
			(*shared)++;
		}else{
			(*plain)++;
			if(last_plain) *last_plain = s;
		}
	}
}

void model_count_matches(struct client *c, const char *topic, unsigned *plain, unsigned *shared)
{
	match_subs(c, topic, plain, shared, NULL);
}

/* Whether the client has at least one plain subscription matching the topic and every one of
 * them has No Local (MQTT v5): its own message then goes to none of them. */
bool model_plain_matches_all_no_local(struct client *c, const char *topic)
{
	struct sub *s, *tmp;
	bool match, any = false;

	HASH_ITER(hh, c->subs, s, tmp){
		if(strncmp(s->filter, "$share/", 7) == 0) continue;
		match = false;
		if(mosquitto_topic_matches_sub(s->filter, topic, &match) != MOSQ_ERR_SUCCESS || !match){
			continue;
		}
		if(!(s->options & SUBOPT_NO_LOCAL)) return false;
		any = true;
	}
	return any;
}

/* Whether exactly one subscription of the client matches the topic and it is a plain one; if
 * so, its granted QoS and subscription identifier (0: none). */
bool model_single_plain_match(struct client *c, const char *topic, uint8_t *qos,
		uint32_t *sub_id)
{
	struct sub *found = NULL;
	unsigned plain, shared;

	match_subs(c, topic, &plain, &shared, &found);
	if(plain != 1 || shared != 0) return false;
	*qos = found->qos;
	*sub_id = found->sub_id;
	return true;
}

struct client_run *model_client_run(struct client *c)
{
	return &c->run;
}

/* Kicks go through here: Mosquitto re-checks the subscriptions of a persistent client it kicks
 * (Debian's CVE-2021-34434 fix, qos 0) inside this call, and those checks must not be taken for
 * SUBSCRIBE packets (plugin.c asks model_is_kicking). */
void model_kick(struct mosquitto *conn, const char *id, bool with_will)
{
	kicking = conn;
	mosquitto_kick_client_by_clientid(id, with_will);
	kicking = NULL;
}

bool model_is_kicking(struct mosquitto *conn)
{
	return conn == kicking;
}

static struct client *client_new(const char *id)
{
	struct client *c = calloc(1, sizeof(*c));

	if(c == NULL) return NULL;
	c->id = strdup(id);
	if(c->id == NULL){
		free(c);
		return NULL;
	}
	c->expiry = EXPIRY_UNKNOWN;
	HASH_ADD_KEYPTR(hh, clients, c->id, strlen(c->id), c);
	return c;
}

static void client_clear_subs(struct client *c)
{
	struct sub *s, *tmp;

	HASH_ITER(hh, c->subs, s, tmp){
		HASH_DEL(c->subs, s);
		free(s->filter);
		free(s);
	}
	n_subs -= c->sub_count;
	n_shared -= c->shared_count;
	c->sub_count = 0;
	c->shared_count = 0;
}

static void client_set_offline(struct client *c)
{
	if(c->online){
		c->online = false;
		n_online--;
	}
	c->conn = NULL;
}

static void client_remove(struct client *c)
{
	inflight_forget(c->id); /* the session is gone: nobody waits for its PUBRELs */
	client_set_offline(c);
	client_clear_subs(c);
	HASH_DEL(clients, c);
	free(c->id);
	free(c->username);
	free(c);
}

void model_cleanup(void)
{
	struct client *c, *ctmp;
	struct pending *p, *ptmp;

	HASH_ITER(hh, clients, c, ctmp){
		client_remove(c);
	}
	HASH_ITER(hh, pendings, p, ptmp){
		pending_drop(p);
	}
	n_online = 0;
	n_subs = 0;
	n_shared = 0;
	pending_order = 0;
	kicking = NULL;
}

/* ---- events ---------------------------------------------------------------------------- */

void emit_connect_rejected(const char *id, const char *username, const char *reason)
{
	cJSON *ev = ev_new("connect_rejected");

	if(ev){
		cjson_add_str_or_null(ev, "client", id);
		cjson_add_str_or_null(ev, "username", username);
		cJSON_AddStringToObject(ev, "reason", reason);
	}
	ev_emit(ev);
}

static void emit_session_expired(struct client *c)
{
	cJSON *ev = ev_new("session_expired");

	if(ev) cJSON_AddStringToObject(ev, "client", c->id);
	client_remove(c);
	ev_emit(ev);
}

/* `conn`: the connection ending (not at a takeover), whose will's fate is reported. */
static void emit_disconnect(struct client *c, bool taken_over, bool kept, int64_t expiry,
		struct mosquitto *conn)
{
	cJSON *ev = ev_new("disconnect");

	if(ev){
		cJSON_AddStringToObject(ev, "client", c->id);
		cJSON_AddBoolToObject(ev, "taken_over", taken_over);
		cJSON_AddBoolToObject(ev, "session_kept", kept);
		cjson_add_expiry(ev, "session_expiry", expiry);
		if(conn) will_add_fate(ev, conn);
	}
	if(kept){
		client_set_offline(c);
		c->expiry = expiry;
		c->expire_at = 0;
		if(!taken_over && expiry > 0 && expiry < EXPIRY_NEVER){
			c->expire_at = time(NULL) + (time_t)expiry;
		}
	}else{
		client_remove(c);
	}
	ev_emit(ev);
}

/* ---- pending connects ------------------------------------------------------------------- */

static struct pending *pending_find(struct mosquitto *conn)
{
	struct pending *p = NULL;

	if(pendings == NULL) return NULL;
	HASH_FIND_PTR(pendings, &conn, p);
	return p;
}

static struct pending *pending_find_id(const char *id, struct mosquitto *not_conn)
{
	struct pending *p, *tmp;

	HASH_ITER(hh, pendings, p, tmp){
		if(p->conn != not_conn && streq(p->id, id)) return p;
	}
	return NULL;
}

static void pending_drop(struct pending *p)
{
	HASH_DEL(pendings, p);
	free(p->id);
	free(p->username);
	free(p);
}

void pending_add(struct mosquitto *conn, const char *id, const char *username)
{
	struct pending *p = pending_find(conn);
	struct client *c;

	if(p) pending_drop(p);
	p = calloc(1, sizeof(*p));
	if(p == NULL) return;
	p->conn = conn;
	p->id = strdup(id);
	p->username = xstrdup(username);
	if(p->id == NULL || (username && p->username == NULL)){
		free(p->id);
		free(p->username);
		free(p);
		return;
	}
	p->clean_start = mosquitto_client_clean_session(conn);
	/* A live connection with this id is about to be taken over: read its session expiry now,
	 * Mosquitto zeroes it before the old connection's DISCONNECT callback. */
	c = model_find(id);
	if(c && c->online && c->conn && c->conn != conn){
		p->have_old_expiry = true;
		p->old_expiry = client_expiry(c->conn);
		if(p->old_expiry < 0) p->old_expiry = c->expiry;
	}
	p->order = ++pending_order;
	p->at_ms = now_ms();
	HASH_ADD_PTR(pendings, conn, p);
}

static void pending_reject(struct pending *p)
{
	emit_connect_rejected(p->id, p->username, "auth");
	pending_drop(p);
}

/* The connection was accepted by every provider: add it to the model, emit `connect`. */
static void pending_resolve(struct pending *p)
{
	struct mosquitto *conn = p->conn;
	struct client *c = model_find(p->id);
	bool clean = mosquitto_client_clean_session(conn);
	int proto = mosquitto_client_protocol_version(conn);
	int64_t expiry = client_expiry(conn);
	bool present = false;
	const char *username = mosquitto_client_username(conn);
	const char *address = mosquitto_client_address(conn);
	cJSON *ev;

	if(c && c->online && c->conn != conn){
		/* Its DISCONNECT should have come first; stay consistent anyway. */
		emit_disconnect(c, true, !clean && c->expiry != 0, c->expiry, NULL);
		c = model_find(p->id);
	}
	if(c && !clean && c->expiry != 0){
		present = true;
		if(c->sub_count > 0 && mosquitto_client_sub_count(conn) == 0){
			/* Mosquitto expired the session a moment before our own timer did. */
			emit_session_expired(c);
			c = NULL;
			present = false;
		}
	}
	if(c && !present){
		client_clear_subs(c); /* clean start, or nothing to resume: the old session is gone */
	}
	if(c == NULL){
		c = client_new(p->id);
	}
	ev = ev_new("connect");
	if(ev){
		cJSON_AddStringToObject(ev, "client", p->id);
		cjson_add_str_or_null(ev, "username", username);
		cJSON_AddStringToObject(ev, "protocol", proto_name(proto));
		cJSON_AddBoolToObject(ev, "clean_start", clean);
		cjson_add_expiry(ev, "session_expiry", expiry);
		cJSON_AddNumberToObject(ev, "keepalive", mosquitto_client_keepalive(conn));
		cJSON_AddBoolToObject(ev, "session_present", present);
		cJSON_AddNumberToObject(ev, "accepted_ms", (double)p->at_ms);
		cjson_add_str_or_null(ev, "address", address);
		will_add_json(ev, conn);
	}
	if(c){
		free(c->username);
		c->username = xstrdup(username);
		c->protocol = proto;
		c->clean_start = clean;
		c->expiry = expiry;
		c->keepalive = mosquitto_client_keepalive(conn);
		if(!c->online){
			c->online = true;
			n_online++;
		}
		c->conn = conn;
		c->expire_at = 0;
		c->queued = 0; /* its queue goes to this connection */
		if(!sidecar_vouched(conn)){
			c->connect_ms = now_ms();
			inflight_on_client_connect(p->id, present);
			if(on_client_connect) on_client_connect(p->id); /* hold.c: a moving session */
		}
	}else{
		mosquitto_log_printf(MOSQ_LOG_ERR, "mqfed: out of memory adding client %s", p->id);
	}
	pending_drop(p);
	ev_emit(ev);
}

/* Resolve the pending connect of this connection, if any: it did something, so every provider
 * accepted it. */
void pending_resolve_conn(struct mosquitto *conn)
{
	struct pending *p = pending_find(conn);

	if(p) pending_resolve(p);
}

void pending_resolve_all(void)
{
	struct pending *p, *tmp;

	HASH_ITER(hh, pendings, p, tmp){
		pending_resolve(p);
	}
}

/* The model entry of a live connection for an event it caused (resolving its pending connect
 * first). With `adopt`, a live client we never saw authenticate (v5 extended auth, TLS identity
 * as username: no BASIC_AUTH callback) is added with a synthetic connect. */
struct client *model_client_for_event(struct mosquitto *conn, bool adopt)
{
	struct pending *p = pending_find(conn);
	const char *id;
	struct client *c;

	if(p) pending_resolve(p);
	id = mosquitto_client_id(conn);
	if(id == NULL) return NULL;
	c = model_find(id);
	if(c && c->online && c->conn == conn) return c;
	if(!adopt || is_sidecar_id(id) || (c && c->online)) return NULL;
	pending_add(conn, id, mosquitto_client_username(conn));
	p = pending_find(conn);
	if(p == NULL) return NULL;
	pending_resolve(p);
	c = model_find(id);
	return (c && c->conn == conn) ? c : NULL;
}

bool model_is_live(struct mosquitto *conn)
{
	const char *id = mosquitto_client_id(conn);
	struct client *c = id ? model_find(id) : NULL;

	return c != NULL && c->online && c->conn == conn;
}

void model_on_disconnect(struct mosquitto *conn)
{
	struct pending *p = pending_find(conn);
	const char *id = mosquitto_client_id(conn);
	struct client *c;
	struct pending *p2;

	if(p){
		if(id == NULL){
			pending_reject(p);
			return;
		}
		pending_resolve(p); /* accepted, then closed before the next tick */
	}
	if(id == NULL) return;
	c = model_find(id);
	/* Not ours: never connected, the sidecar's old connection, or an offline session whose
	 * context Mosquitto disconnects once more when a new connection takes it over. */
	if(c == NULL || !c->online || c->conn != conn) return;

	p2 = pending_find_id(id, conn);
	if(p2){
		/* Takeover: connect__on_authorised() of the new connection is running right now. The
		 * session moves to it when it asked for clean start false and the old one had an
		 * expiry; Mosquitto has already zeroed the old connection's fields. */
		int64_t old = p2->have_old_expiry ? p2->old_expiry : c->expiry;
		emit_disconnect(c, true, !p2->clean_start && old != 0, old, NULL);
	}else{
		int64_t expiry = client_expiry(conn);
		/* expiry 0: Mosquitto frees the session right after this callback.
		 * unknown (v5, calibration failed): assume kept (fail-safe: never lose a session). */
		emit_disconnect(c, false, expiry != 0, expiry, conn);
	}
}

void model_subscribe(struct client *c, const char *filter, uint8_t qos)
{
	struct sub *s = NULL;
	cJSON *ev;

	HASH_FIND_STR(c->subs, filter, s);
	if(s && s->qos == qos) return; /* no change (e. the same subscription again) */
	if(s){
		s->qos = qos;
		s->options = 0; /* reported as unknown: read again (subopts.c) */
		s->sub_id = 0;
	}else{
		s = calloc(1, sizeof(*s));
		if(s == NULL) return;
		s->filter = strdup(filter);
		if(s->filter == NULL){
			free(s);
			return;
		}
		s->qos = qos;
		HASH_ADD_KEYPTR(hh, c->subs, s->filter, strlen(s->filter), s);
		c->sub_count++;
		if(strncmp(filter, "$share/", 7) == 0){
			c->shared_count++;
			n_shared++;
		}
		n_subs++;
	}
	ev = ev_new("subscribe");
	if(ev){
		cJSON_AddStringToObject(ev, "client", c->id);
		cJSON_AddStringToObject(ev, "filter", filter);
		cJSON_AddNumberToObject(ev, "qos", qos);
		cJSON_AddNullToObject(ev, "options");
		cJSON_AddNullToObject(ev, "subscription_id");
	}
	ev_emit(ev);
}

/* The options Mosquitto holds for a subscription, read after it was added (subopts.c): a
 * subscribe event with them when they differ from what was last reported. */
void model_sub_options(struct client *c, const char *filter, uint8_t options, uint32_t sub_id)
{
	struct sub *s = NULL;
	cJSON *ev;

	HASH_FIND_STR(c->subs, filter, s);
	if(s == NULL || (s->options == options && s->sub_id == sub_id)) return;
	s->options = options;
	s->sub_id = sub_id;
	ev = ev_new("subscribe");
	if(ev){
		cJSON_AddStringToObject(ev, "client", c->id);
		cJSON_AddStringToObject(ev, "filter", filter);
		cJSON_AddNumberToObject(ev, "qos", s->qos);
		cJSON_AddNumberToObject(ev, "options", s->qos | options);
		if(sub_id) cJSON_AddNumberToObject(ev, "subscription_id", sub_id);
		else cJSON_AddNullToObject(ev, "subscription_id");
	}
	ev_emit(ev);
}

void model_unsubscribe(struct client *c, const char *filter)
{
	struct sub *s = NULL;
	cJSON *ev;

	HASH_FIND_STR(c->subs, filter, s);
	if(s == NULL) return; /* it had no such subscription: nothing changes */
	HASH_DEL(c->subs, s);
	if(strncmp(s->filter, "$share/", 7) == 0){
		c->shared_count--;
		n_shared--;
	}
	free(s->filter);
	free(s);
	c->sub_count--;
	n_subs--;
	ev = ev_new("unsubscribe");
	if(ev){
		cJSON_AddStringToObject(ev, "client", c->id);
		cJSON_AddStringToObject(ev, "filter", filter);
	}
	ev_emit(ev);
}

/* Mosquitto expires a session once now > disconnect time + expiry (session_expiry.c, checked
 * once a second). We use one more second, so we never report an expiry before Mosquitto did it;
 * a reconnect in between is caught by pending_resolve(). */
void model_expire_sessions(time_t now)
{
	struct client *c, *tmp;

	HASH_ITER(hh, clients, c, tmp){
		if(!c->online && c->expire_at > 0 && c->expire_at + 1 < now){
			emit_session_expired(c);
		}
	}
}

/* Calibration just succeeded: online clients whose v5 expiry was unknown can be read now. */
void model_fill_unknown_expiry(void)
{
	struct client *c, *tmp;

	HASH_ITER(hh, clients, c, tmp){
		if(c->online && c->conn && c->expiry == EXPIRY_UNKNOWN){
			c->expiry = client_expiry(c->conn);
		}
	}
}

/* The client's subscriptions (for splitting a snapshot). */
unsigned model_client_subs(const struct client *c)
{
	return c->sub_count;
}

/* The client as a snapshot entry with at most `max` of its subscriptions, from `*from` on
 * (NULL: the first); `*from` is left at the next one (NULL after the last). */
cJSON *model_client_json_part(struct client *c, void **from, unsigned max)
{
	cJSON *o = cJSON_CreateObject();
	cJSON *subs;
	struct sub *s = *from ? (struct sub *)*from : c->subs;
	unsigned n = 0;

	if(o == NULL) return NULL;
	cJSON_AddStringToObject(o, "client", c->id);
	cjson_add_str_or_null(o, "username", c->username);
	cJSON_AddStringToObject(o, "protocol", proto_name(c->protocol));
	cJSON_AddBoolToObject(o, "clean_start", c->clean_start);
	cjson_add_expiry(o, "session_expiry", c->expiry);
	cJSON_AddBoolToObject(o, "online", c->online);
	if(c->online && c->conn && *from == NULL) will_add_json(o, c->conn);
	subs = cJSON_AddArrayToObject(o, "subscriptions");
	if(subs == NULL){
		cJSON_Delete(o);
		return NULL;
	}
	for(; s != NULL && n < max; s = s->hh.next, n++){
		cJSON *j = cJSON_CreateObject();
		if(j == NULL){
			cJSON_Delete(o);
			return NULL;
		}
		cJSON_AddStringToObject(j, "filter", s->filter);
		cJSON_AddNumberToObject(j, "qos", s->qos);
		cJSON_AddItemToArray(subs, j);
	}
	*from = s;
	return o;
}

cJSON *model_client_json(struct client *c)
{
	void *from = NULL;

	return model_client_json_part(c, &from, UINT32_MAX);
}

void model_note_queued(const char *id)
{
	struct client *c = id ? model_find(id) : NULL;

	if(c && !c->online && c->queued < UINT32_MAX) c->queued++;
}

cJSON *model_queued_json(const cJSON *ids, unsigned max)
{
	cJSON *o = cJSON_CreateObject();
	const cJSON *item;
	struct client *c, *tmp;
	unsigned n = 0;

	if(o == NULL) return NULL;
	if(cJSON_IsArray(ids)){
		cJSON_ArrayForEach(item, ids){
			if(!cJSON_IsString(item) || n >= max) continue;
			c = model_find(item->valuestring);
			if(c && !c->online){
				cJSON_AddNumberToObject(o, c->id, c->queued);
				n++;
			}
		}
		return o;
	}
	HASH_ITER(hh, clients, c, tmp){
		if(n >= max) break;
		if(!c->online && c->queued){
			cJSON_AddNumberToObject(o, c->id, c->queued);
			n++;
		}
	}
	return o;
}

uint64_t model_queued_total(void)
{
	struct client *c, *tmp;
	uint64_t total = 0;

	HASH_ITER(hh, clients, c, tmp){
		if(!c->online) total += c->queued;
	}
	return total;
}
