/* Commands from the sidecar on $CONTROL/mqfed/v1 and their replies; the deny list. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "batch.h"
#include "calib.h"
#include "capture.h"
#include "commands.h"
#include "cut.h"
#include "events.h"
#include "hold.h"
#include "inflight.h"
#include "inject.h"
#include "journal.h"
#include "linkin.h"
#include "linkout.h"
#include "model.h"
#include "origin.h"
#include "recent.h"
#include "shed.h"
#include "sidecar.h"
#include "subopts.h"

#define REPLY_PREFIX "$SYS/broker/mqfed/replies/"
#define SNAPSHOT_SUBS 5000 /* subscriptions per snapshot chunk at most */

enum deny_mode { DENY_RETRY, DENY_REFUSE, DENY_SESSION };

/* An entry of the deny list (a set of client ids, with its mode). */
struct id_entry {
	UT_hash_handle hh;
	char *id;
	enum deny_mode mode;
};

static unsigned snapshot_chunk;
/* Closed (option sessions_gate): every connect that would resume a session is closed without
 * a CONNACK until the sidecar, in sync, has put the sessions held elsewhere on the deny list
 * and made the ones this node owns (`open_sessions`): a restarted Mosquitto has none. */
static bool gate_closed;
/* Closed by `admission` (a drain): every connect but the sidecar's own connections and its
 * shadows is closed without a CONNACK, a retriable network failure: the client tries again
 * elsewhere (through its load balancer). */
static bool admission_closed;
static uint64_t drained_connects;
static struct id_entry *denies;
static uint64_t denied_connects;

void commands_init(unsigned chunk, bool sessions_gate)
{
	snapshot_chunk = chunk;
	gate_closed = sessions_gate;
}

bool sessions_gate_closed(void)
{
	return gate_closed;
}

bool admission_refuses(void)
{
	if(!admission_closed) return false;
	drained_connects++;
	return true;
}

/* ---- the deny list ------------------------------------------------------------------ */

static struct id_entry *id_find(struct id_entry *set, const char *id)
{
	struct id_entry *e = NULL;

	if(id == NULL || set == NULL) return NULL;
	HASH_FIND_STR(set, id, e);
	return e;
}

/* `id`'s entry in *set, added if missing (NULL: out of memory). */
static struct id_entry *id_add(struct id_entry **set, const char *id)
{
	struct id_entry *e = id_find(*set, id);

	if(e != NULL) return e;
	e = calloc(1, sizeof(*e));
	if(e) e->id = strdup(id);
	if(e == NULL || e->id == NULL){
		free(e);
		return NULL;
	}
	HASH_ADD_KEYPTR(hh, *set, e->id, strlen(e->id), e);
	return e;
}

static void id_remove(struct id_entry **set, struct id_entry *e)
{
	HASH_DEL(*set, e);
	free(e->id);
	free(e);
}

static void id_clear(struct id_entry **set)
{
	struct id_entry *e, *tmp;

	HASH_ITER(hh, *set, e, tmp){
		id_remove(set, e);
	}
}

/* Whether a connect of client `id` (asking for a clean start or not) is denied: counted,
 * and *refuse tells how. Mode `session` denies (as retry) only a connect that would resume a
 * session: the cluster holds that client's session on another node and makes it here first. */
bool deny_connect(const char *id, bool clean_start, bool *refuse)
{
	struct id_entry *d = id_find(denies, id);

	if(d == NULL || (d->mode == DENY_SESSION && clean_start)) return false;
	denied_connects++;
	*refuse = d->mode == DENY_REFUSE;
	return true;
}

void commands_cleanup(void)
{
	id_clear(&denies);

	denied_connects = 0;
	drained_connects = 0;
	snapshot_chunk = 0;
	gate_closed = false;
	admission_closed = false;
}

/* ---- replies --------------------------------------------------------------------------- */

struct request {
	const char *id;
	const char *reply;
	const char *cmd;
};

static cJSON *reply_new(const struct request *rq, bool ok)
{
	cJSON *o = cJSON_CreateObject();

	if(o == NULL) return NULL;
	cJSON_AddNumberToObject(o, "v", 1);
	cJSON_AddStringToObject(o, "id", rq->id);
	cjson_add_str_or_null(o, "cmd", rq->cmd);
	cJSON_AddBoolToObject(o, "ok", ok);
	return o;
}

static void reply_send(const struct request *rq, cJSON *o)
{
	char *json;
	int rc;

	if(o == NULL){
		mosquitto_log_printf(MOSQ_LOG_ERR, "mqfed: out of memory building a reply to %s", rq->id);
		return;
	}
	json = cJSON_PrintUnformatted(o);
	cJSON_Delete(o);
	if(json == NULL){
		mosquitto_log_printf(MOSQ_LOG_ERR, "mqfed: out of memory printing a reply to %s", rq->id);
		return;
	}
	/* addressed to the sidecar's client id: no subscription needed, never seen by others */
	rc = mosquitto_broker_publish_copy(sidecar_id(), rq->reply, (int)strlen(json), json, 1,
			false, NULL);
	if(rc != MOSQ_ERR_SUCCESS){
		mosquitto_log_printf(MOSQ_LOG_WARNING, "mqfed: publishing a reply failed (%d)", rc);
	}
	free(json);
}

static void reply_error(const struct request *rq, const char *code)
{
	cJSON *o = reply_new(rq, false);

	if(o) cJSON_AddStringToObject(o, "error", code);
	reply_send(rq, o);
}

static void reply_ok(const struct request *rq)
{
	reply_send(rq, reply_new(rq, true));
}

/* A non-negative integer field; false if missing or not an integer. */
static bool get_uint(const cJSON *req, const char *key, uint64_t *out)
{
	const cJSON *j = cJSON_GetObjectItemCaseSensitive(req, key);

	if(!cJSON_IsNumber(j)) return false;
	if(j->valuedouble < 0 || j->valuedouble > 9007199254740992.0
			|| floor(j->valuedouble) != j->valuedouble){
		return false;
	}
	*out = (uint64_t)j->valuedouble;
	return true;
}

/* ---- commands -------------------------------------------------------------------------- */

/* Walk the sessions in snapshot chunks: a chunk closes after `snapshot_chunk` entries or
 * SNAPSHOT_SUBS subscriptions, and a client with more subscriptions than fit is split over
 * consecutive chunks (entries of the same client, which the sidecar merges). With `rq` NULL
 * only counts the chunks; else sends them, `chunks` being that count. */
static unsigned snapshot_walk(const struct request *rq, unsigned chunks, uint64_t cut)
{
	unsigned chunk = 0, entries = 0, subs = 0;
	struct client *c;
	cJSON *o = NULL, *list = NULL;

	for(c = model_next(NULL); c; c = model_next(c)){
		unsigned left = model_client_subs(c);
		void *from = NULL;
		do{
			unsigned take = left < SNAPSHOT_SUBS - subs ? left : SNAPSHOT_SUBS - subs;
			if(rq && o == NULL){
				o = reply_new(rq, true);
				if(o){
					cJSON_AddStringToObject(o, "epoch", ev_epoch());
					cJSON_AddNumberToObject(o, "seq", (double)cut);
					cJSON_AddNumberToObject(o, "chunk", chunk);
					cJSON_AddNumberToObject(o, "chunks", chunks);
					list = cJSON_AddArrayToObject(o, "clients");
				}
			}
			if(rq && list) cJSON_AddItemToArray(list, model_client_json_part(c, &from, take));
			entries++;
			subs += take;
			left -= take;
			if(entries == snapshot_chunk || subs == SNAPSHOT_SUBS){
				if(rq) reply_send(rq, o);
				o = NULL;
				list = NULL;
				entries = subs = 0;
				chunk++;
			}
		}while(left > 0);
	}
	if(entries > 0 || chunk == 0){
		if(rq && o == NULL){
			o = reply_new(rq, true);
			if(o){
				cJSON_AddStringToObject(o, "epoch", ev_epoch());
				cJSON_AddNumberToObject(o, "seq", (double)cut);
				cJSON_AddNumberToObject(o, "chunk", chunk);
				cJSON_AddNumberToObject(o, "chunks", chunks);
				cJSON_AddArrayToObject(o, "clients");
			}
		}
		if(rq) reply_send(rq, o);
		chunk++;
	}
	return chunk;
}

static void cmd_snapshot(const struct request *rq)
{
	unsigned chunks = snapshot_walk(NULL, 0, 0);
	uint64_t cut = ev_snapshot_cut();

	snapshot_walk(rq, chunks, cut);
	ev_publish_pending();
}

static void cmd_resume(const struct request *rq, const cJSON *req)
{
	uint64_t from, oldest = ev_oldest();
	const char *epoch = cjson_get_str(req, "epoch");
	bool ok;
	cJSON *o;

	if(!get_uint(req, "from_seq", &from)){
		reply_error(rq, "bad_request");
		return;
	}
	ok = from >= oldest && from <= ev_next_seq() && (epoch == NULL || streq(epoch, ev_epoch()));
	o = reply_new(rq, ok);
	if(o){
		cJSON_AddStringToObject(o, "epoch", ev_epoch());
		cJSON_AddNumberToObject(o, "from_seq", (double)from);
		if(!ok){
			cJSON_AddStringToObject(o, "error", "gap");
			cJSON_AddNumberToObject(o, "oldest", (double)oldest);
		}
	}
	reply_send(rq, o); /* the reply comes before the replayed events */
	if(ok){
		ev_resume(from, &oldest);
	}
}

#define DELIVER_BATCH_MAX 10000 /* messages in one deliver_batch */

/* One message (`deliver`, or one of a `deliver_batch`) into `client`'s session or connection
 * (`c`: its model entry, NULL for the forwarding connection), with Subscription Identifier
 * `sub_id` unless 0 or the message names its own; NULL, or the error code. */
static const char *deliver_item(const char *client, struct client *c, const cJSON *item,
		uint32_t sub_id)
{
	struct json_message m;
	int rc;

	if(message_from_json(item, &m)) return "bad_request";
	/* a barrier probe to .fwd (a token): with capture on, also a marker among the records,
	 * so the sidecar knows when every record captured before it has reached it */
	if(c == NULL && m.len > 0 && streq(m.topic, CUT_PROBE_TOPIC)
			&& streq(client, sidecar_fwd_id()) && (m.len < 4 || memcmp(m.payload, "cut:", 4) != 0)){
		capture_marker(MQFB_KIND_BARRIER, NULL, m.payload, (uint32_t)m.len);
	}
	if(sub_id && cJSON_GetObjectItemCaseSensitive(item, "subscription_ids") == NULL
			&& mosquitto_property_add_varint(&m.props, MQTT_PROP_SUBSCRIPTION_IDENTIFIER, sub_id)){
		free(m.payload);
		mosquitto_property_free_all(&m.props);
		return "internal";
	}
	rc = mosquitto_broker_publish_copy(client, m.topic, (int)m.len, m.payload, m.qos, false,
			m.props);
	free(m.payload);
	if(m.qos > 0) inflight_note_targeted(); /* it takes a packet id before a release would */
	if(rc != MOSQ_ERR_SUCCESS){
		mosquitto_property_free_all(&m.props);
		return "internal";
	}
	if(c != NULL && !model_client_online(c) && m.qos > 0){
		model_note_queued(client); /* held by its offline session: `queued` counts it */
	}
	return NULL;
}

static void cmd_deliver(const struct request *rq, const cJSON *req)
{
	const char *client = cjson_get_str(req, "client");
	const char *subscription = cjson_get_str(req, "subscription");
	const char *error;
	struct client *c;
	cJSON *o;

	if(client == NULL){
		reply_error(rq, "bad_request");
		return;
	}
	/* the forwarding connections take probes: their packet id follows every copy routed to
	 * one before, so a gap before a probe shows copies Mosquitto dropped (docs/plugin-protocol.md);
	 * `.fwd` while connected, a shard `.fwd<k>` whenever (its session queues it) */
	c = model_find(client);
	if(c == NULL && !(sidecar_fwd_conn() != NULL && streq(client, sidecar_fwd_id()))
			&& sidecar_fwd_shard(client) <= 0){
		reply_error(rq, "unknown_client");
		return;
	}
	/* a delivery for a subscription (a shared group's pick) is refused once the client has
	 * left it: requests made before its UNSUBSCRIBE may still be queued behind it; it goes
	 * with that subscription's identifier, as Mosquitto's own routing would give it */
	if(subscription != NULL){
		if(c == NULL || !model_client_has_sub(c, subscription)){
			reply_error(rq, "not_subscribed");
			return;
		}
	}
	error = deliver_item(client, c, req, subscription ? model_sub_identifier(c, subscription) : 0);
	if(error){
		reply_error(rq, error);
		return;
	}
	o = reply_new(rq, true);
	if(o) cJSON_AddBoolToObject(o, "queued", c != NULL && !model_client_online(c));
	reply_send(rq, o);
}

/* Many messages for one client, in order (a moving session's queue): like `deliver` for each;
 * on the first bad one, stops and says how many went before it (`delivered`). */
static void cmd_deliver_batch(const struct request *rq, const cJSON *req)
{
	const char *client = cjson_get_str(req, "client");
	const cJSON *items = cJSON_GetObjectItemCaseSensitive(req, "messages");
	const cJSON *item;
	const char *error = NULL;
	struct client *c;
	unsigned delivered = 0;
	cJSON *o;

	if(client == NULL || !cJSON_IsArray(items) || cJSON_GetArraySize(items) > DELIVER_BATCH_MAX){
		reply_error(rq, "bad_request");
		return;
	}
	c = model_find(client);
	if(c == NULL){
		reply_error(rq, "unknown_client");
		return;
	}
	cJSON_ArrayForEach(item, items){
		error = deliver_item(client, c, item, 0);
		if(error) break;
		delivered++;
	}
	o = reply_new(rq, error == NULL);
	if(o){
		if(error) cJSON_AddStringToObject(o, "error", error);
		cJSON_AddNumberToObject(o, "delivered", delivered);
		cJSON_AddBoolToObject(o, "queued", !model_client_online(c));
	}
	reply_send(rq, o);
}

static void cmd_kick(const struct request *rq, const cJSON *req)
{
	const char *client = cjson_get_str(req, "client");
	const cJSON *ww = cJSON_GetObjectItemCaseSensitive(req, "with_will");
	struct client *c;
	struct mosquitto *conn;
	char *id;

	if(client == NULL || (ww && !cJSON_IsBool(ww))){
		reply_error(rq, "bad_request");
		return;
	}
	c = model_find(client);
	conn = c ? model_client_conn(c) : NULL;
	if(conn == NULL){
		/* Kicking an offline session is a use-after-free in 2.0.11: never do it. */
		reply_error(rq, "not_connected");
		return;
	}
	id = strdup(model_client_id(c)); /* c may be freed by the DISCONNECT callback during the kick */
	if(id == NULL){
		reply_error(rq, "internal");
		return;
	}
	model_kick(conn, id, cJSON_IsTrue(ww));
	free(id);
	reply_ok(rq);
}

/* deny {client | clients: [...], mode}: one client id, or many in one command (a joining or
 * restarted node puts every session held elsewhere on the list). */
static void cmd_deny(const struct request *rq, const cJSON *req)
{
	const char *client = cjson_get_str(req, "client");
	const char *mode = cjson_get_str(req, "mode");
	const cJSON *clients = cJSON_GetObjectItemCaseSensitive(req, "clients");
	const cJSON *item;
	enum deny_mode m;
	struct id_entry *d;

	if((client == NULL) == (clients == NULL) || (clients && !cJSON_IsArray(clients))
			|| mode == NULL || (!streq(mode, "retry") && !streq(mode, "refuse")
				&& !streq(mode, "session"))){
		reply_error(rq, "bad_request");
		return;
	}
	cJSON_ArrayForEach(item, clients){
		if(!cJSON_IsString(item) || item->valuestring[0] == '\0'){
			reply_error(rq, "bad_request");
			return;
		}
	}
	m = streq(mode, "refuse") ? DENY_REFUSE : streq(mode, "session") ? DENY_SESSION : DENY_RETRY;
	if(client){
		d = id_add(&denies, client);
		if(d == NULL){
			reply_error(rq, "internal");
			return;
		}
		d->mode = m;
	}
	cJSON_ArrayForEach(item, clients){
		d = id_add(&denies, item->valuestring);
		if(d == NULL){
			reply_error(rq, "internal");
			return;
		}
		d->mode = m;
	}
	reply_ok(rq);
}

/* hold {client, on, ring?, live?, cut?, since_ms?, granted?, cuts?}: on: the client's offline
 * session here queues nothing (ring: a replica, which keeps what it refuses for a while;
 * live, cut: see hold.c; granted and cuts with cut: a chained move's skips); off: it queues
 * again, first replaying what a ring refused at or after since_ms when given, or (granted,
 * cuts) a live ring without what the old copy had. */
static void cmd_hold(const struct request *rq, const cJSON *req)
{
	const char *client = cjson_get_str(req, "client");
	const cJSON *on = cJSON_GetObjectItemCaseSensitive(req, "on");
	const cJSON *ring = cJSON_GetObjectItemCaseSensitive(req, "ring");
	const cJSON *live = cJSON_GetObjectItemCaseSensitive(req, "live");
	const cJSON *since = cJSON_GetObjectItemCaseSensitive(req, "since_ms");
	const cJSON *cut = cJSON_GetObjectItemCaseSensitive(req, "cut");
	const cJSON *granted = cJSON_GetObjectItemCaseSensitive(req, "granted");
	const cJSON *cuts = cJSON_GetObjectItemCaseSensitive(req, "cuts");

	if(client == NULL || !cJSON_IsBool(on) || (ring && !cJSON_IsBool(ring))
			|| (live && !cJSON_IsBool(live)) || (since && !cJSON_IsNumber(since))
			|| (cut && !cJSON_IsBool(cut))
			|| ((granted || cuts) && (since || (cJSON_IsTrue(on) && !cJSON_IsTrue(cut))))){
		reply_error(rq, "bad_request");
		return;
	}
	if(cJSON_IsTrue(on)){
		/* a chained move's old copy: its live ring goes in without what its old copy had */
		if((granted || cuts) && hold_chain_skips(client, granted, cuts) != 0){
			reply_error(rq, "bad_request");
			return;
		}
		if(hold_set(client, ring && cJSON_IsTrue(ring), live && cJSON_IsTrue(live),
					cJSON_IsTrue(cut)) != 0){
			reply_error(rq, "internal");
			return;
		}
	}else if(granted || cuts){ /* a new copy's release without what the old copy had */
		if(hold_release_skipping(client, granted, cuts) != 0){
			reply_error(rq, "bad_request");
			return;
		}
	}else{
		hold_release(client, since != NULL, since ? (int64_t)since->valuedouble : 0);
	}
	reply_ok(rq);
}

/* What a moving session's old copy granted (identities), for its new copy to skip. */
static void cmd_granted(const struct request *rq, const cJSON *req)
{
	const char *client = cjson_get_str(req, "client");
	cJSON *o, *list;

	if(client == NULL){
		reply_error(rq, "bad_request");
		return;
	}
	list = cut_granted_json(client);
	if(list == NULL){
		reply_error(rq, "not_moving");
		return;
	}
	o = reply_new(rq, true);
	if(o) cJSON_AddItemToObject(o, "granted", list);
	else cJSON_Delete(list);
	reply_send(rq, o);
}

/* `sub_options`: {"client", "subscriptions": {filter: options byte}}: give each existing
 * subscription of the client its No Local and Retain As Published (subopts_set); a shadow's
 * SUBSCRIBE of a filter the session has cannot change them in Mosquitto 2.0.11. */
static void cmd_sub_options(const struct request *rq, const cJSON *req)
{
	const char *client = cjson_get_str(req, "client");
	const cJSON *subs = cJSON_GetObjectItemCaseSensitive(req, "subscriptions");
	const cJSON *item;
	const char *error;

	if(client == NULL || !cJSON_IsObject(subs)){
		reply_error(rq, "bad_request");
		return;
	}
	cJSON_ArrayForEach(item, subs){
		if(!cJSON_IsNumber(item) || item->valuedouble < 0 || item->valuedouble > 255){
			reply_error(rq, "bad_request");
			return;
		}
	}
	cJSON_ArrayForEach(item, subs){
		error = subopts_set(client, item->string, (uint8_t)item->valuedouble);
		if(error){
			reply_error(rq, error);
			return;
		}
	}
	reply_ok(rq);
}

static void cmd_admit(const struct request *rq, const cJSON *req)
{
	const char *client = cjson_get_str(req, "client");
	struct id_entry *d;

	if(client == NULL){
		reply_error(rq, "bad_request");
		return;
	}
	d = id_find(denies, client);
	if(d) id_remove(&denies, d);
	reply_ok(rq);
}

/* A drain (`open` false) or its end (`open` true): see admission_closed. Connections already
 * up stay; the sidecar kicks them. */
static void cmd_admission(const struct request *rq, const cJSON *req)
{
	const cJSON *open = cJSON_GetObjectItemCaseSensitive(req, "open");

	if(!cJSON_IsBool(open)){
		reply_error(rq, "bad_request");
		return;
	}
	if(admission_closed == cJSON_IsTrue(open)){
		mosquitto_log_printf(MOSQ_LOG_NOTICE, "mqfed: %s", cJSON_IsTrue(open)
				? "admitting clients again (the drain ended)"
				: "draining: refusing every client connect (no CONNACK: clients retry elsewhere)");
	}
	admission_closed = !cJSON_IsTrue(open);
	reply_ok(rq);
}

/* A subscription filter, or $share/<group>/<filter> with a group free of '/', '+' and '#'. */
static bool valid_filter(const char *filter)
{
	const char *inner;
	size_t group;

	if(filter == NULL) return false;
	inner = strip_share(filter);
	if(strncmp(filter, "$share/", 7) == 0){
		if(inner == filter) return false;
		group = (size_t)(inner - filter) - 8;
		if(group == 0 || memchr(filter + 7, '+', group) || memchr(filter + 7, '#', group)){
			return false;
		}
	}
	return mosquitto_sub_topic_check(inner) == MOSQ_ERR_SUCCESS;
}

/* Catch-up (recent.c): the recent publishes a peer's new subscriptions missed here.
 * `filters`: [{filter (verbatim, $share/<g>/ included), since (ms, the subscribe time)}]. */
static void cmd_catchup(const struct request *rq, const cJSON *req)
{
	const cJSON *list = cJSON_GetObjectItemCaseSensitive(req, "filters"), *it;
	struct recent_query *q;
	unsigned n, i = 0;
	uint64_t since;
	const char *filter, *err = NULL;
	cJSON *o;

	n = cJSON_IsArray(list) ? (unsigned)cJSON_GetArraySize(list) : 0;
	if(n == 0 || n > RECENT_MAX_FILTERS){
		reply_error(rq, "bad_request");
		return;
	}
	q = calloc(n, sizeof(*q));
	if(q == NULL){
		reply_error(rq, "internal");
		return;
	}
	cJSON_ArrayForEach(it, list){
		filter = cjson_get_str(it, "filter");
		if(!valid_filter(filter) || !get_uint(it, "since", &since) || since > INT64_MAX){
			err = "bad_request";
			break;
		}
		q[i].filter = filter;
		q[i].since_ms = (int64_t)since;
		i++;
	}
	o = err ? NULL : reply_new(rq, true);
	if(err == NULL && o == NULL) err = "internal";
	if(err == NULL) err = recent_catchup(q, n, o);
	free(q);
	if(err){
		cJSON_Delete(o);
		reply_error(rq, err);
		return;
	}
	reply_send(rq, o);
}

static void add_recent_stats(cJSON *o)
{
	struct recent_stats rs;

	recent_stats(&rs);
	cJSON_AddNumberToObject(o, "catchup_entries", (double)rs.entries);
	cJSON_AddNumberToObject(o, "catchup_bytes", (double)rs.bytes);
	cJSON_AddNumberToObject(o, "catchup_pending", (double)rs.pending);
	cJSON_AddNumberToObject(o, "catchup_replayed", (double)rs.replayed);
	cJSON_AddNumberToObject(o, "catchup_requests", (double)rs.requests);
	cJSON_AddNumberToObject(o, "catchup_incomplete", (double)rs.incomplete);
}

/* The sidecar's report (every ~0.5 s): the copies it holds unacknowledged, its running count
 * of copies taken, and how long to shed (shed.c). */
static void cmd_pressure(const struct request *rq, const cJSON *req)
{
	uint64_t unacked, taken, lease;
	struct shed_stats sh;
	cJSON *o;

	if(!get_uint(req, "unacked", &unacked) || !get_uint(req, "taken", &taken)
			|| !get_uint(req, "shed_ms", &lease) || lease > 600000){
		reply_error(rq, "bad_request");
		return;
	}
	shed_report(unacked, taken, (int64_t)lease);
	shed_stats(&sh);
	o = reply_new(rq, true);
	if(o){
		cJSON_AddBoolToObject(o, "shedding", shed_active());
		cJSON_AddNumberToObject(o, "shed_total", (double)sh.total);
		cJSON_AddNumberToObject(o, "backlog", (double)shed_backlog());
		add_recent_stats(o);
	}
	reply_send(rq, o);
}

/* Fire and forget: copies the sidecar confirmed, as base64 of 8-byte fingerprints. */
static void cmd_confirm(const cJSON *req)
{
	const char *fps = cjson_get_str(req, "fps");
	unsigned char *raw = NULL;
	size_t len = 0;

	if(fps == NULL || b64_decode(fps, &raw, &len) || len % 8){
		mosquitto_log_printf(MOSQ_LOG_WARNING, "mqfed: ignoring a malformed confirm command");
	}else{
		journal_confirm(raw, len / 8);
	}
	free(raw);
}

static void add_journal_stats(cJSON *o)
{
	struct journal_stats js;
	cJSON *j;

	journal_stats(&js);
	j = cJSON_AddObjectToObject(o, "journal");
	if(j == NULL) return;
	cJSON_AddBoolToObject(j, "on", js.on);
	cJSON_AddNumberToObject(j, "live", (double)js.live);
	cJSON_AddNumberToObject(j, "live_bytes", (double)js.live_bytes);
	cJSON_AddNumberToObject(j, "file_bytes", (double)js.file_bytes);
	cJSON_AddNumberToObject(j, "written", (double)js.written);
	cJSON_AddNumberToObject(j, "trimmed", (double)js.trimmed);
	cJSON_AddNumberToObject(j, "confirmations", (double)js.confirmations);
	cJSON_AddNumberToObject(j, "unmatched", (double)js.unmatched);
	cJSON_AddNumberToObject(j, "expired", (double)js.expired);
	cJSON_AddNumberToObject(j, "errors", (double)js.errors);
	cJSON_AddNumberToObject(j, "compactions", (double)js.compactions);
}

static void add_capture_stats(cJSON *o)
{
	struct capture_stats cs;
	cJSON *c;

	capture_stats(&cs);
	c = cJSON_AddObjectToObject(o, "capture");
	if(c == NULL) return;
	cJSON_AddBoolToObject(c, "on", cs.on);
	cJSON_AddBoolToObject(c, "connected", cs.connected);
	cJSON_AddNumberToObject(c, "next_seq", (double)cs.next_seq);
	cJSON_AddNumberToObject(c, "records", (double)cs.records);
	cJSON_AddNumberToObject(c, "buffered", (double)cs.buffered);
	cJSON_AddNumberToObject(c, "buffered_bytes", (double)cs.buffered_bytes);
	cJSON_AddNumberToObject(c, "acked", (double)cs.acked);
	cJSON_AddNumberToObject(c, "dropped", (double)cs.dropped);
	cJSON_AddNumberToObject(c, "passed", (double)cs.passed);
	cJSON_AddNumberToObject(c, "connects", (double)cs.connects);
	cJSON_AddNumberToObject(c, "malformed", (double)cs.malformed);
	cJSON_AddNumberToObject(c, "sent_bytes", (double)cs.sent_bytes);
}

/* `links`: what links out and in did; `link_list`: each link out. */
static void add_link_stats(cJSON *o)
{
	struct linkout_stats ls;
	struct linkin_stats li;
	cJSON *c, *list;

	linkout_stats(&ls);
	linkin_stats(&li);
	c = cJSON_AddObjectToObject(o, "links");
	if(c == NULL) return;
	cJSON_AddNumberToObject(c, "links", ls.links);
	cJSON_AddNumberToObject(c, "up", ls.up);
	cJSON_AddNumberToObject(c, "records", (double)ls.records);
	cJSON_AddNumberToObject(c, "batches", (double)ls.batches);
	cJSON_AddNumberToObject(c, "acked", (double)ls.acked);
	cJSON_AddNumberToObject(c, "resent", (double)ls.resent);
	cJSON_AddNumberToObject(c, "refused", (double)ls.refused);
	cJSON_AddNumberToObject(c, "abandoned", (double)ls.abandoned);
	cJSON_AddNumberToObject(c, "connects", (double)ls.connects);
	cJSON_AddNumberToObject(c, "failures", (double)ls.failures);
	cJSON_AddNumberToObject(c, "held_bytes", (double)ls.held_bytes);
	cJSON_AddNumberToObject(c, "in_connected", li.connected);
	cJSON_AddNumberToObject(c, "in_batches", (double)li.batches);
	cJSON_AddNumberToObject(c, "in_duplicates", (double)li.duplicates);
	cJSON_AddNumberToObject(c, "in_refused", (double)li.refused);
	list = linkout_links_json();
	if(list) cJSON_AddItemToObject(c, "list", list);
}

static void cmd_link(const struct request *rq, const cJSON *req, bool filters)
{
	const char *why = NULL;
	const char *error = filters ? linkout_filters(req, &why) : linkout_configure(req, &why);
	cJSON *o;

	if(error == NULL){
		reply_ok(rq);
		return;
	}
	o = reply_new(rq, false);
	if(o){
		cJSON_AddStringToObject(o, "error", error);
		if(why) cJSON_AddStringToObject(o, "why", why);
	}
	reply_send(rq, o);
}

static void cmd_stats(const struct request *rq)
{
	cJSON *o = reply_new(rq, true);
	cJSON *cal;
	struct ev_stats ev;
	struct origin_stats og;
	struct inject_stats ij;
	struct shed_stats sh;
	uint64_t held, ring_messages, ring_bytes, replayed, replays_waited, replays_flushed;
	uint64_t chains_cut;

	ev_stats(&ev);
	origin_stats(&og);
	inject_stats(&ij);
	hold_stats(&held, &ring_messages, &ring_bytes, &replayed, &replays_waited, &replays_flushed,
			&chains_cut);
	shed_stats(&sh);
	if(o){
		cJSON_AddStringToObject(o, "epoch", ev_epoch());
		cJSON_AddNumberToObject(o, "seq", (double)ev.seq);
		cJSON_AddNumberToObject(o, "acked", (double)ev.acked);
		cJSON_AddNumberToObject(o, "buffered", (double)ev.buffered);
		cJSON_AddNumberToObject(o, "buffered_bytes", (double)ev.buffered_bytes);
		cJSON_AddNumberToObject(o, "clients", model_online());
		cJSON_AddNumberToObject(o, "sessions", model_sessions());
		cJSON_AddNumberToObject(o, "subscriptions", (double)model_subscriptions());
		cJSON_AddNumberToObject(o, "events_total", (double)ev.events_total);
		inflight_stats(o);
		cJSON_AddNumberToObject(o, "overflows", (double)ev.overflows);
		cJSON_AddNumberToObject(o, "denied", HASH_COUNT(denies));
		cJSON_AddNumberToObject(o, "denied_connects", (double)denied_connects);
		cJSON_AddBoolToObject(o, "admission", !admission_closed);
		cJSON_AddNumberToObject(o, "drained_connects", (double)drained_connects);
		cJSON_AddNumberToObject(o, "held", (double)held);
		cJSON_AddNumberToObject(o, "ring_messages", (double)ring_messages);
		cJSON_AddNumberToObject(o, "ring_bytes", (double)ring_bytes);
		cJSON_AddNumberToObject(o, "replayed", (double)replayed);
		cJSON_AddNumberToObject(o, "replays_waited", (double)replays_waited);
		cJSON_AddNumberToObject(o, "replays_flushed", (double)replays_flushed);
		cJSON_AddNumberToObject(o, "chains_cut", (double)chains_cut);
		cJSON_AddNumberToObject(o, "published", (double)ev.published);
		cJSON_AddNumberToObject(o, "fwd_shared_denied", (double)og.denied);
		cJSON_AddNumberToObject(o, "inject_batches", (double)ij.batches);
		cJSON_AddNumberToObject(o, "inject_messages", (double)ij.messages);
		cJSON_AddNumberToObject(o, "inject_refused", (double)ij.refused);
		cJSON_AddNumberToObject(o, "inject_left_out", (double)ij.left_out);
		cJSON_AddNumberToObject(o, "inject_slow_clients", ij.slow_clients);
		cJSON_AddNumberToObject(o, "inject_no_local", (double)og.no_local);
		cut_stats(o);
		cJSON_AddNumberToObject(o, "fwd_qos2_tracked", og.tracked);
		cJSON_AddNumberToObject(o, "fwd_qos2_forgotten", (double)og.forgotten);
		cJSON_AddNumberToObject(o, "fwd_filters", sh.filters);
		cJSON_AddNumberToObject(o, "fwd_since_report", (double)sh.since_report);
		cJSON_AddNumberToObject(o, "fwd_unread", (double)sh.unread);
		cJSON_AddNumberToObject(o, "fwd_backlog", (double)shed_backlog());
		cJSON_AddBoolToObject(o, "shedding", shed_active());
		cJSON_AddNumberToObject(o, "shed_total", (double)sh.total);
		cJSON_AddBoolToObject(o, "catchup", recent_enabled());
		add_recent_stats(o);
		cal = cJSON_AddObjectToObject(o, "calibration");
		if(cal) cJSON_AddStringToObject(cal, "session_expiry", calib_name());
		add_journal_stats(o);
		add_capture_stats(o);
		add_link_stats(o);
	}
	reply_send(rq, o);
}

/* {"messages": [...]}: QoS 2 messages `client` had acknowledged with PUBREC but not seen
 * released when it left this node (inflight.c), for the node where it resumed; `forget` (ids)
 * drops those first (that node has them). */
static void cmd_unreleased(const struct request *rq, const cJSON *req)
{
	const char *client = cjson_get_str(req, "client");
	const cJSON *forget = cJSON_GetObjectItemCaseSensitive(req, "forget");
	struct client *c;
	cJSON *o;

	if(client == NULL || (forget != NULL && !cJSON_IsArray(forget))){
		reply_error(rq, "bad_request");
		return;
	}
	inflight_forget_ids(client, forget);
	c = model_find(client);
	o = reply_new(rq, true);
	if(o){
		cJSON_AddItemToObject(o, "messages", inflight_unreleased_json(client,
				c != NULL && model_client_online(c) && !sidecar_vouched(model_client_conn(c))));
	}
	reply_send(rq, o);
}

/* Send those messages to `client` here with their own packet ids (at the end of this loop
 * iteration): the client then gets the PUBREL it waits for. */
static void cmd_release(const struct request *rq, const cJSON *req)
{
	const char *error = inflight_release(cjson_get_str(req, "client"),
			cJSON_GetObjectItemCaseSensitive(req, "messages"));

	if(error) reply_error(rq, error);
	else reply_ok(rq);
}

#define QUEUED_MAX 10000 /* entries in one `queued` reply */

/* {"queued": {id: n}, "total": n}: messages routed to offline sessions (`clients`: these ids,
 * an empty array for the total only; else every offline session that has some), for
 * `mqfed ctl sessions` and a drain's progress. */
static void cmd_queued(const struct request *rq, const cJSON *req)
{
	cJSON *o = reply_new(rq, true);
	cJSON *q;

	if(o){
		q = model_queued_json(cJSON_GetObjectItemCaseSensitive(req, "clients"), QUEUED_MAX);
		if(q) cJSON_AddItemToObject(o, "queued", q);
		cJSON_AddNumberToObject(o, "total", (double)model_queued_total());
	}
	reply_send(rq, o);
}

/* A message on $CONTROL/mqfed/v1 (plugin.c's CONTROL callback). */
void commands_on_control(const struct mosquitto_evt_control *ed)
{
	struct request rq;
	cJSON *req;
	const cJSON *v;
	uint64_t seq;

	if(ed->client != sidecar_conn() || sidecar_conn() == NULL){
		/* The ACL check already refuses this; never act on anyone but the sidecar. */
		return;
	}
	pending_resolve_all(); /* every pending connect is accepted by now: keep the model whole */

	req = cJSON_ParseWithLength(ed->payload, ed->payloadlen);
	if(!cJSON_IsObject(req)){
		mosquitto_log_printf(MOSQ_LOG_WARNING, "mqfed: ignoring a malformed command (not a JSON object)");
		cJSON_Delete(req);
		return;
	}
	rq.id = cjson_get_str(req, "id");
	rq.reply = cjson_get_str(req, "reply");
	rq.cmd = cjson_get_str(req, "cmd");
	v = cJSON_GetObjectItemCaseSensitive(req, "v");

	if(streq(rq.cmd, "ack") && cJSON_IsNumber(v) && v->valuedouble == 1){
		const char *epoch = cjson_get_str(req, "epoch");
		if(epoch && !streq(epoch, ev_epoch())){
			/* an ack for an earlier plugin run: acking now would drop this run's events */
		}else if(get_uint(req, "seq", &seq)){
			ev_ack(seq);
		}else{
			mosquitto_log_printf(MOSQ_LOG_WARNING, "mqfed: ignoring an ack without a valid seq");
		}
		cJSON_Delete(req);
		return;
	}
	if(streq(rq.cmd, "confirm") && cJSON_IsNumber(v) && v->valuedouble == 1){
		cmd_confirm(req);
		cJSON_Delete(req);
		return;
	}
	if(rq.id == NULL || rq.reply == NULL
			|| strncmp(rq.reply, REPLY_PREFIX, strlen(REPLY_PREFIX)) != 0
			|| mosquitto_pub_topic_check(rq.reply) != MOSQ_ERR_SUCCESS){
		mosquitto_log_printf(MOSQ_LOG_WARNING,
				"mqfed: ignoring a command without a usable id and reply topic (under "
				REPLY_PREFIX ")");
		cJSON_Delete(req);
		return;
	}

	if(!cJSON_IsNumber(v) || v->valuedouble != 1){
		reply_error(&rq, "unsupported_version");
	}else if(rq.cmd == NULL){
		reply_error(&rq, "bad_request");
	}else if(streq(rq.cmd, "snapshot")){
		cmd_snapshot(&rq);
	}else if(streq(rq.cmd, "resume")){
		cmd_resume(&rq, req);
	}else if(streq(rq.cmd, "deliver")){
		cmd_deliver(&rq, req);
	}else if(streq(rq.cmd, "deliver_batch")){
		cmd_deliver_batch(&rq, req);
	}else if(streq(rq.cmd, "kick")){
		cmd_kick(&rq, req);
	}else if(streq(rq.cmd, "deny")){
		cmd_deny(&rq, req);
	}else if(streq(rq.cmd, "admit")){
		cmd_admit(&rq, req);
	}else if(streq(rq.cmd, "hold")){
		cmd_hold(&rq, req);
	}else if(streq(rq.cmd, "links")){
		cmd_link(&rq, req, false);
	}else if(streq(rq.cmd, "link_filters")){
		cmd_link(&rq, req, true);
	}else if(streq(rq.cmd, "sub_options")){
		cmd_sub_options(&rq, req);
	}else if(streq(rq.cmd, "granted")){
		cmd_granted(&rq, req);
	}else if(streq(rq.cmd, "open_sessions")){
		gate_closed = false;
		reply_ok(&rq);
	}else if(streq(rq.cmd, "admission")){
		cmd_admission(&rq, req);
	}else if(streq(rq.cmd, "pressure")){
		cmd_pressure(&rq, req);
	}else if(streq(rq.cmd, "queued")){
		cmd_queued(&rq, req);
	}else if(streq(rq.cmd, "unreleased")){
		cmd_unreleased(&rq, req);
	}else if(streq(rq.cmd, "release")){
		cmd_release(&rq, req);
	}else if(streq(rq.cmd, "stats")){
		cmd_stats(&rq);
	}else if(streq(rq.cmd, "catchup")){
		cmd_catchup(&rq, req);
	}else if(streq(rq.cmd, "ack")){
		reply_error(&rq, "unsupported_version");
	}else{
		reply_error(&rq, "unknown_command");
	}
	cJSON_Delete(req);
}
