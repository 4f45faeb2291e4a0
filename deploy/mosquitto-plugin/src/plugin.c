/* mqfed Mosquitto plugin: entry points, options, access decisions and the event callbacks.
 * The only module that wires the others to Mosquitto (util.h lists them, lowest first).
 * Contract: docs/plugin-protocol.md. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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
#include "util.h"
#include "will.h"

#define MQFED_VERSION "0.1.0"
#define MQFED_CONTROL_TOPIC "$CONTROL/mqfed/v1"
#define MQFED_SIDECAR_USER "mqfed-sidecar"
/* A client's message: topic and forwarded properties at most this (with message_size_limit):
 * what the sidecar's `deliver` command carries of them, JSON-escaped, must fit Mosquitto's
 * max_packet_size along with the base64 payload (docs/plugin-protocol.md, "Message size"). */
#define MQFED_HEADERS_MAX (1u << 20)
/* Refusals of the same kind are logged at most once per this period, with a count. */
#define MQFED_REFUSAL_LOG_MS 10000

/* Options of the other modules, handed to their init. */
struct module_opts {
	const char *sidecar_id;
	const char *sidecar_socket;
	uint64_t window;
	uint64_t batch;           /* event_batch */
	uint64_t buf_max_events;
	uint64_t buf_max_bytes;
	unsigned snapshot_chunk;
	uint64_t fwd_q2_max;
	uint64_t fwd_backlog_max;
	bool sessions_gate;
	uint64_t catchup_ms;
	uint64_t catchup_bytes;
	const char *journal_dir;  /* journal.c; NULL: no journal */
	uint64_t journal_max_age; /* seconds */
	uint64_t max_queued;      /* Mosquitto's max_queued_messages, for inject.c (0: unknown) */
	const char *capture_socket; /* capture.c; NULL: capture off */
	uint64_t capture_max_bytes;
	const char *link_secret;  /* linkin.c; NULL: links refused */
};

static mosquitto_plugin_id_t *pid;

/* options */
static char *secret;
static bool auth_grant;
static bool acl_grant;
static long heartbeat_ms;
static uint64_t size_limit;    /* message_size_limit: largest client payload; 0 = none */

/* our own ACL check asked again while it runs (later_verdict) */
static bool nested;

/* rate-limited warnings: refused uses of the sidecar's identity, messages over the limit */
static struct ratelog identity_log;
static struct ratelog impostor_log;
static struct ratelog oversize_log;

/* " (N more held back)" after a rate-limited line, or "" */
static const char *held_note(char *buf, size_t size, uint64_t held)
{
	buf[0] = '\0';
	if(held > 0){
		snprintf(buf, size, " (%llu more like it in the last %d s)", (unsigned long long)held,
				MQFED_REFUSAL_LOG_MS / 1000);
	}
	return buf;
}

/* timers */
static int64_t last_heartbeat_ms;
static time_t last_expiry_check;

/* Internal to Mosquitto but exported by the 2.0.11 broker binary. Weak, so a build without it
 * still loads; used only to tell the subscribe ACL re-check of a kick (client state no longer
 * "active") from a real SUBSCRIBE packet (handle_subscribe.c requires state active). */
extern int mosquitto__get_state(struct mosquitto *mosq) __attribute__((weak));
#define MOSQ_CS_NEW 0 /* enum mosquitto_client_state in lib/mosquitto_internal.h */
#define MOSQ_CS_ACTIVE 3
#define MOSQ_CS_DISCONNECTED 7 /* an offline session (context.c, context__disconnect) */

/* The broker's full ACL chain (security.c), exported but not in the public headers. Weak: without
 * it a subscription refused by a later provider is still reported. */
extern int mosquitto_acl_check(struct mosquitto *context, const char *topic, uint32_t payloadlen,
		void *payload, uint8_t qos, bool retain, int access) __attribute__((weak));

/* ---- options --------------------------------------------------------------------------- */

static int parse_u64(const char *key, const char *val, uint64_t min, uint64_t max, uint64_t *out)
{
	char *end = NULL;
	unsigned long long v;

	errno = 0;
	v = strtoull(val, &end, 10);
	if(errno || end == val || *end != '\0' || val[0] == '-' || v < min || v > max){
		mosquitto_log_printf(MOSQ_LOG_ERR, "mqfed: invalid plugin_opt_%s '%s' (%llu..%llu)",
				key, val, (unsigned long long)min, (unsigned long long)max);
		return -1;
	}
	*out = v;
	return 0;
}

static int parse_mode(const char *key, const char *val, bool *grant)
{
	if(streq(val, "grant")){
		*grant = true;
	}else if(streq(val, "defer")){
		*grant = false;
	}else{
		mosquitto_log_printf(MOSQ_LOG_ERR, "mqfed: plugin_opt_%s must be grant or defer, not '%s'",
				key, val);
		return -1;
	}
	return 0;
}

static int parse_options(struct mosquitto_opt *opts, int count, struct module_opts *mo)
{
	int i;
	uint64_t v;

	auth_grant = true;
	acl_grant = true;
	heartbeat_ms = 1000;
	mo->sidecar_id = NULL;
	mo->sidecar_socket = NULL;
	size_limit = 0;
	mo->window = 500;
	mo->batch = 1;
	mo->buf_max_events = 1000000;
	mo->buf_max_bytes = 268435456;
	mo->snapshot_chunk = 500;
	mo->fwd_q2_max = 65535;
	mo->fwd_backlog_max = 0;
	mo->sessions_gate = false;
	mo->catchup_ms = 0;
	mo->catchup_bytes = 16u << 20;
	mo->journal_dir = NULL;
	mo->journal_max_age = 3600;
	mo->max_queued = 0;
	mo->capture_socket = NULL;
	mo->capture_max_bytes = 64u << 20;
	mo->link_secret = NULL;

	for(i = 0; i < count; i++){
		const char *k = opts[i].key;
		const char *val = opts[i].value ? opts[i].value : "";

		if(streq(k, "sidecar_secret")){
			free(secret);
			secret = strdup(val);
		}else if(streq(k, "sidecar_id")){
			mo->sidecar_id = val;
		}else if(streq(k, "sidecar_socket")){
			if(val[0] != '/'){
				mosquitto_log_printf(MOSQ_LOG_ERR, "mqfed: plugin_opt_sidecar_socket must be "
						"the absolute path of the private unix-socket listener, not '%s'", val);
				return -1;
			}
			mo->sidecar_socket = val;
		}else if(streq(k, "message_size_limit")){
			if(parse_u64(k, val, 0, 268435455, &size_limit)) return -1;
		}else if(streq(k, "auth")){
			if(parse_mode(k, val, &auth_grant)) return -1;
		}else if(streq(k, "acl")){
			if(parse_mode(k, val, &acl_grant)) return -1;
		}else if(streq(k, "event_window")){
			if(parse_u64(k, val, 1, 1000000, &mo->window)) return -1;
		}else if(streq(k, "event_batch")){
			if(parse_u64(k, val, 1, 10000, &mo->batch)) return -1;
		}else if(streq(k, "buffer_max_events")){
			if(parse_u64(k, val, 1, UINT32_MAX, &mo->buf_max_events)) return -1;
		}else if(streq(k, "buffer_max_bytes")){
			if(parse_u64(k, val, 1024, UINT64_MAX / 2, &mo->buf_max_bytes)) return -1;
		}else if(streq(k, "heartbeat_ms")){
			if(parse_u64(k, val, 10, 3600000, &v)) return -1;
			heartbeat_ms = (long)v;
		}else if(streq(k, "snapshot_chunk")){
			if(parse_u64(k, val, 1, 1000000, &v)) return -1;
			mo->snapshot_chunk = (unsigned)v;
		}else if(streq(k, "fwd_qos2_max")){
			if(parse_u64(k, val, 1, 1000000, &mo->fwd_q2_max)) return -1;
		}else if(streq(k, "sessions_gate")){
			if(!streq(val, "true") && !streq(val, "false")){
				mosquitto_log_printf(MOSQ_LOG_ERR,
						"mqfed: plugin_opt_sessions_gate must be true or false, not '%s'", val);
				return -1;
			}
			mo->sessions_gate = streq(val, "true");
		}else if(streq(k, "fwd_backlog_max")){
			if(parse_u64(k, val, 0, UINT32_MAX, &mo->fwd_backlog_max)) return -1;
		}else if(streq(k, "catchup_ms")){
			if(parse_u64(k, val, 0, 600000, &mo->catchup_ms)) return -1;
		}else if(streq(k, "catchup_bytes")){
			if(parse_u64(k, val, 1024, UINT32_MAX, &mo->catchup_bytes)) return -1;
		}else if(streq(k, "journal_dir")){
			if(val[0] != '\0' && val[0] != '/'){
				mosquitto_log_printf(MOSQ_LOG_ERR, "mqfed: plugin_opt_journal_dir must be an "
						"absolute path (or empty: no journal), not '%s'", val);
				return -1;
			}
			mo->journal_dir = val;
		}else if(streq(k, "journal_max_age")){
			if(parse_u64(k, val, 0, 31536000, &mo->journal_max_age)) return -1;
		}else if(streq(k, "max_queued_messages")){
			if(parse_u64(k, val, 0, INT32_MAX, &mo->max_queued)) return -1;
		}else if(streq(k, "capture_socket")){
			if(val[0] != '\0' && val[0] != '/'){
				mosquitto_log_printf(MOSQ_LOG_ERR, "mqfed: plugin_opt_capture_socket must be "
						"an absolute path (or empty: no capture), not '%s'", val);
				return -1;
			}
			mo->capture_socket = val;
		}else if(streq(k, "capture_max_bytes")){
			if(parse_u64(k, val, 65536, UINT64_MAX / 2, &mo->capture_max_bytes)) return -1;
		}else if(streq(k, "link_secret")){
			if(strlen(val) < 16 || strlen(val) > 200){
				mosquitto_log_printf(MOSQ_LOG_ERR, "mqfed: plugin_opt_link_secret must have "
						"16 to 200 characters");
				return -1;
			}
			mo->link_secret = val;
		}else{
			mosquitto_log_printf(MOSQ_LOG_WARNING, "mqfed: unknown option plugin_opt_%s ignored", k);
		}
	}
	if(secret == NULL || secret[0] == '\0'){
		mosquitto_log_printf(MOSQ_LOG_ERR,
				"mqfed: plugin_opt_sidecar_secret is required; refusing to load");
		return -1;
	}
	if(mo->sidecar_id == NULL){
		mo->sidecar_id = "mqfed-sidecar";
	}
	if(mo->sidecar_id[0] == '\0'){
		mosquitto_log_printf(MOSQ_LOG_ERR, "mqfed: plugin_opt_sidecar_id must not be empty");
		return -1;
	}
	return 0;
}

/* ---- access ---------------------------------------------------------------------------- */

/* Not a live connection but a session Mosquitto checks on behalf of: an offline session
 * (state "disconnected"), or check_retain_source's zeroed stack copy of the publisher of a
 * retained message (state "new", no address; retain.c). A connecting client is "new" too, but
 * has an address. */
static bool session_only(struct mosquitto *client)
{
	int state;

	if(mosquitto__get_state == NULL) return false;
	state = mosquitto__get_state(client);
	return state == MOSQ_CS_DISCONNECTED
		|| (state == MOSQ_CS_NEW && mosquitto_client_address(client) == NULL);
}

/* The sidecar for ACL purposes: its live connections, which proved its identity (the secret,
 * on the private socket; sidecar.c vouches for them until their DISCONNECT), and the sessions
 * Mosquitto checks on their behalf: the OFFLINE session of one (queueing cluster messages
 * while it restarts) and, with check_retain_source, the copy of the publisher of a retained
 * message it published. Those carry its client id and username; a session an impostor left
 * queues at most what is checked again, and denied, when a connection takes it over. */
static bool is_sidecar(struct mosquitto *client)
{
	const char *id;

	if(client == NULL) return false;
	if(client == sidecar_conn() || client == sidecar_fwd_conn()) return true;
	id = mosquitto_client_id(client);
	if(!is_sidecar_id(id)) return false;
	if(sidecar_vouched(client)) return true; /* e.g. one being replaced by a newer one */
	return session_only(client) && streq(mosquitto_client_username(client), MQFED_SIDECAR_USER);
}

/* A shadow (sessions.md): the sidecar acting as client C to make, drain or delete C's
 * session here. Its username is the sidecar's and it proved the secret on the private
 * socket; also true of the offline session it leaves. */
static bool is_shadow(struct mosquitto *client)
{
	const char *id;

	if(client == NULL || client == sidecar_conn() || client == sidecar_fwd_conn()) return false;
	id = mosquitto_client_id(client);
	if(id == NULL || is_reserved_id(id)
			|| !streq(mosquitto_client_username(client), MQFED_SIDECAR_USER)){
		return false;
	}
	return sidecar_vouched(client) || session_only(client);
}

/* Given neither is_sidecar nor is_shadow: a client using the sidecar's client id (or another
 * reserved one, is_reserved_id) or username without having proven it. Mosquitto asks no
 * plugin before such a connect on a listener with use_identity_as_username /
 * use_subject_as_username (TLS certificate, PSK identity), and another auth plugin may grant
 * it: every ACL check is its first chance to be stopped. */
static bool is_impostor(struct mosquitto *client)
{
	return is_reserved_id(mosquitto_client_id(client))
		|| streq(mosquitto_client_username(client), MQFED_SIDECAR_USER);
}

/* An impostor gets nothing: READ and the checks for a session are denied; any packet of its
 * own (PUBLISH, SUBSCRIBE, UNSUBSCRIBE) disconnects it (an error other than "denied": the
 * broker closes the connection, "not authorised"). */
static int refuse_impostor(const struct mosquitto_evt_acl_check *ed)
{
	uint64_t held;
	char note[80];
	bool live = !session_only(ed->client);

	if(!live || ed->access == MOSQ_ACL_READ) return MOSQ_ERR_ACL_DENIED;
	if(ratelog_due(&impostor_log, MQFED_REFUSAL_LOG_MS, &held)){
		mosquitto_log_printf(MOSQ_LOG_WARNING,
				"mqfed: disconnected client '%s' (username '%s', from %s): it uses the "
				"sidecar's client id or username without having proven it (only the secret on "
				"the private unix socket does; a TLS identity, PSK identity or another plugin "
				"authenticated it)%s",
				mosquitto_client_id(ed->client), mosquitto_client_username(ed->client),
				mosquitto_client_address(ed->client), held_note(note, sizeof(note), held));
	}
	return MOSQ_ERR_AUTH;
}

/* The topics the sidecar uses (docs/plugin-protocol.md, "Reserved topics"): events, replies,
 * probes and drain markers under $SYS/broker/mqfed, commands and barriers under
 * $CONTROL/mqfed, the retained read sentinel under $mqfed. No other client may publish or
 * receive there, nor subscribe to a filter inside them. Wider filters (`$SYS/#`) match
 * $SYS/broker/mqfed/… and are allowed; their READ checks are denied. No wider filter matches
 * $mqfed/… or $CONTROL/…: a wildcard at the first level never matches a `$` topic. */
static bool reserved(const char *topic)
{
	return topic_in_subtree(topic, "$mqfed") || topic_in_subtree(topic, "$SYS/broker/mqfed")
		|| topic_in_subtree(topic, "$CONTROL/mqfed");
}

/* What shed.c needs to know: the filters the forwarding connections (.fwd and its shards)
 * subscribe to, and the copies routed to them. */
static void on_fwd_acl(const struct mosquitto_evt_acl_check *ed)
{
	if(ed->topic == NULL) return;
	switch(ed->access){
		case MOSQ_ACL_SUBSCRIBE:
			shed_fwd_filter(ed->topic, true);
			recent_fwd_filter(ed->topic, true);
			if(sidecar_fwd_shard(mosquitto_client_id(ed->client)) == 0){
				capture_fwd_filter(ed->topic, true);
			}
			break;
		case MOSQ_ACL_UNSUBSCRIBE:
			shed_fwd_filter(ed->topic, false);
			recent_fwd_filter(ed->topic, false);
			if(sidecar_fwd_shard(mosquitto_client_id(ed->client)) == 0){
				capture_fwd_filter(ed->topic, false);
			}
			break;
		case MOSQ_ACL_READ:
			/* not the re-check of its queued messages while a forwarding connection connects
			 * (state not yet active, handle_connect.c): those were counted when they were
			 * routed. A live shard is vouched for; its offline session is not. */
			if((ed->client == sidecar_fwd_conn() || sidecar_vouched(ed->client))
					&& mosquitto__get_state
					&& mosquitto__get_state(ed->client) != MOSQ_CS_ACTIVE){
				break;
			}
			shed_fwd_routed(ed->qos);
			journal_fwd_read(ed->topic, ed->payload, ed->payloadlen);
			break;
		default:
			break;
	}
}

/* `.fwd` itself (not a shard), live or its offline session, for capture: not the re-check of
 * its queued messages while it connects. */
static bool capturing_fwd(struct mosquitto *client)
{
	int state;

	if(client != sidecar_fwd_conn() && sidecar_fwd_shard(mosquitto_client_id(client)) != 0){
		return false;
	}
	if(mosquitto__get_state == NULL) return true;
	state = mosquitto__get_state(client);
	return state == MOSQ_CS_ACTIVE || state == MOSQ_CS_DISCONNECTED;
}

static bool is_recheck(struct mosquitto *client)
{
	if(model_is_kicking(client)) return true;
	if(mosquitto__get_state && mosquitto__get_state(client) != MOSQ_CS_ACTIVE) return true;
	return false;
}

/* What the rest of the chain (the providers after us) decides, by asking Mosquitto again while
 * our own callback defers. Only needed in defer mode; in grant mode we are the decision. */
static int later_verdict(struct mosquitto *client, const char *topic, uint8_t qos, int access)
{
	int rc;

	if(acl_grant || mosquitto_acl_check == NULL) return MOSQ_ERR_SUCCESS;
	nested = true;
	rc = mosquitto_acl_check(client, topic, 0, NULL, qos, false, access);
	nested = false;
	return rc;
}

static void on_sub_acl(struct mosquitto *client, const char *filter, uint8_t qos, int access,
		bool trusted)
{
	struct client *c;
	const char *id;

	if(is_recheck(client)){
		/* Not a SUBSCRIBE packet: Debian's CVE-2021-34434 fix re-checks (qos 0) every
		 * subscription of a persistent client being kicked and silently removes the denied
		 * ones. Nothing changes unless the rest of the chain now denies it. */
		pending_resolve_conn(client); /* accepted: it is being kicked after connecting */
		if(access != MOSQ_ACL_SUBSCRIBE || trusted) return;
		if(later_verdict(client, filter, qos, access) == MOSQ_ERR_SUCCESS) return;
		id = mosquitto_client_id(client);
		c = model_find(id);
		if(c && (!model_client_online(c) || model_client_conn(c) == client)){
			model_unsubscribe(c, filter);
		}
		return;
	}
	if(!trusted && later_verdict(client, filter, qos, access) != MOSQ_ERR_SUCCESS){
		return; /* refused by a later provider: the broker does not add/remove it */
	}
	c = model_client_for_event(client, true);
	if(c == NULL) return;
	if(access == MOSQ_ACL_SUBSCRIBE){
		model_subscribe(c, filter, qos);
		subopts_note(client, filter, qos); /* its options, once Mosquitto added it */
	}else{
		model_unsubscribe(c, filter);
	}
}

/* A client's connect was accepted (model.c): a moving session's hold and record (hold.c,
 * cut.c). */
static void on_client_connect(const char *id)
{
	hold_on_connect(id);
	cut_on_connect(id);
}

static int on_acl_check(int event, void *event_data, void *userdata)
{
	struct mosquitto_evt_acl_check *ed = event_data;
	int pass = acl_grant ? MOSQ_ERR_SUCCESS : MOSQ_ERR_PLUGIN_DEFER;
	bool shadow, shared_check = false, recorded = false;
	int state;
	uint64_t origin, seq;

	(void)event;
	(void)userdata;
	if(nested) return MOSQ_ERR_PLUGIN_DEFER;
	if(ed->access == MOSQ_ACL_READ){
		shared_check = origin_shared_check(ed->client, ed->topic);
		/* a message re-injected by .fwd never goes to a shared subscription nor to a
		 * forwarding connection (origin.c) */
		if(origin_read_denied(ed->client, ed->topic, ed->payload, ed->payloadlen, ed->qos,
					ed->retain, shared_check)){
			return MOSQ_ERR_ACL_DENIED;
		}
		/* catch-up: note the routing; the control connection's `#` only observes (recent.c) */
		if(recent_read(ed->client, ed->topic, ed->payload, ed->payloadlen, ed->qos, ed->retain)){
			return MOSQ_ERR_ACL_DENIED;
		}
		/* capture: a client's message for a plain subscription of .fwd becomes a record on
		 * the capture socket instead of a copy Mosquitto queues (capture.c) */
		if(!shared_check && capture_enabled() && capturing_fwd(ed->client)
				&& capture_read(ed->topic, ed->payload, ed->payloadlen, ed->qos, &recorded)){
			/* the record is .fwd's one copy for the journal (confirmed as before) */
			if(recorded) journal_fwd_read(ed->topic, ed->payload, ed->payloadlen);
			return MOSQ_ERR_ACL_DENIED;
		}
		inflight_on_read(ed->client); /* before Mosquitto may queue it (inflight.c) */
		/* an injected message for a live client: its queue sizes the sidecar's next batches */
		if(origin_read_injected() && !is_sidecar(ed->client) && mosquitto__get_state
				&& mosquitto__get_state(ed->client) == MOSQ_CS_ACTIVE && !is_shadow(ed->client)){
			inject_measure(ed->client);
		}
	}else{
		origin_event();
	}
	if(linkin_conn(ed->client)){ /* a peer's plugin: its batches and their replies only */
		return (ed->access == MOSQ_ACL_WRITE && streq(ed->topic, MQFED_INJECT_TOPIC))
			|| (ed->access == MOSQ_ACL_READ && streq(ed->topic, MQFED_INJECT_REPLY))
			? MOSQ_ERR_SUCCESS : MOSQ_ERR_ACL_DENIED;
	}
	if(is_sidecar(ed->client)){
		if(sidecar_is_fwd(ed->client)) on_fwd_acl(ed);
		else if(ed->access == MOSQ_ACL_SUBSCRIBE) recent_sidecar_checks();
		return MOSQ_ERR_SUCCESS;
	}
	/* a shadow makes the subscriptions its client had on another node, where they were
	 * checked; its session's queued messages are the client's: granted, and reported */
	shadow = is_shadow(ed->client);
	if(!shadow && is_impostor(ed->client)) return refuse_impostor(ed);
	if(ed->topic == NULL) return pass;
	if(ed->access != MOSQ_ACL_UNSUBSCRIBE && reserved(ed->access == MOSQ_ACL_SUBSCRIBE
				? strip_share(ed->topic) : ed->topic)){
		return MOSQ_ERR_ACL_DENIED;
	}
	if(ed->access == MOSQ_ACL_READ && mosquitto__get_state
			&& ((state = mosquitto__get_state(ed->client)) == MOSQ_CS_DISCONNECTED
				|| state == MOSQ_CS_ACTIVE)
			&& hold_refuses(mosquitto_client_id(ed->client), shared_check,
				state == MOSQ_CS_ACTIVE && !shadow, ed->topic, ed->payload,
				ed->payloadlen, ed->qos)){
		/* An offline session the sidecar holds queues nothing (`hold`): its client is
		 * served by another node, or a shadow made it here ahead of its client, while the
		 * node the client comes from still queues for it (and hands that over: never
		 * twice); a replica's ring hold keeps it for a while; a live hold keeps what reaches
		 * its connected client until the old node's queue is in (hold.c). A shadow
		 * connected to a held copy (draining or making it) is the offline copy too: what
		 * it would get, the client gets where it is. A connect re-checks the queue as
		 * another context, so that passes. */
		return MOSQ_ERR_ACL_DENIED;
	}
	if(shadow && ed->access != MOSQ_ACL_WRITE) pass = MOSQ_ERR_SUCCESS;
	/* a moving session's old copy: the new node's messages from its cut on are the new
	 * copy's (cut.c) */
	if(ed->access == MOSQ_ACL_READ && !shared_check && mosquitto__get_state
			&& mosquitto__get_state(ed->client) == MOSQ_CS_DISCONNECTED
			&& origin_read_identity(&origin, &seq)
			&& cut_refuses(mosquitto_client_id(ed->client), origin, seq)){
		return MOSQ_ERR_ACL_DENIED;
	}
	if(ed->access == MOSQ_ACL_READ && ed->qos > 0 && mosquitto__get_state
			&& mosquitto__get_state(ed->client) == MOSQ_CS_DISCONNECTED
			&& later_verdict(ed->client, ed->topic, ed->qos, MOSQ_ACL_READ)
				== MOSQ_ERR_SUCCESS && inflight_offline_takes(ed->client)){
		/* (a full queue drops it: neither counted nor granted to a move, whose new copy
		 * keeps it instead) */
		model_note_queued(mosquitto_client_id(ed->client)); /* `ctl sessions` */
		if(origin_read_identity(&origin, &seq)){ /* for a move (cut.c) */
			cut_note_granted(mosquitto_client_id(ed->client), origin, seq);
		}
	}

	switch(ed->access){
		case MOSQ_ACL_SUBSCRIBE:
		case MOSQ_ACL_UNSUBSCRIBE:
			on_sub_acl(ed->client, ed->topic, ed->qos, ed->access, shadow);
			return pass;
		default:
			return pass;
	}
}

/* A refused use of the sidecar's identity at connect: logged at most once per period, with
 * the count of those held back (a client retrying in a loop writes one line, not thousands). */
static void log_refused_identity(const char *id, const char *username, const char *why)
{
	uint64_t held;
	char note[80];

	if(!ratelog_due(&identity_log, MQFED_REFUSAL_LOG_MS, &held)) return;
	mosquitto_log_printf(MOSQ_LOG_WARNING, "mqfed: refused client '%s' (username '%s'): %s%s",
			id ? id : "", username ? username : "", why, held_note(note, sizeof(note), held));
}

/* Whether the sidecar's credentials came with this connect, on the private socket; logs why
 * not. */
static bool proves_sidecar(struct mosquitto *client, const char *id, const char *username,
		const char *password, bool by_id)
{
	if(!streq(username, MQFED_SIDECAR_USER) || !secret_equal(password, secret)){
		log_refused_identity(id, username, by_id ? "it uses the sidecar's client id without "
				"its credentials" : "it uses the sidecar's username without its secret");
		return false;
	}
	if(!sidecar_private(client)){
		log_refused_identity(id, username, "the sidecar's credentials are accepted only on "
				"its private unix-socket listener");
		return false;
	}
	return true;
}

static int on_basic_auth(int event, void *event_data, void *userdata)
{
	struct mosquitto_evt_basic_auth *ed = event_data;
	struct mosquitto *client = ed->client;
	const char *id = mosquitto_client_id(client);
	bool refuse;

	(void)event;
	(void)userdata;
	origin_event();
	if(id == NULL){
		return auth_grant ? MOSQ_ERR_SUCCESS : MOSQ_ERR_PLUGIN_DEFER;
	}
	if(is_sidecar_id(id)){
		if(!proves_sidecar(client, id, ed->username, ed->password, true)){
			emit_connect_rejected(id, ed->username, "auth");
			return MOSQ_ERR_AUTH;
		}
		sidecar_vouch(client);
		if(sidecar_fwd_shard(id) > 0){
			return MOSQ_ERR_SUCCESS; /* a forwarding shard: subscriptions only, vouched for */
		}else if(streq(id, sidecar_fwd_id())){
			sidecar_set_fwd_conn(client);
			origin_fwd_auth(client);
			capture_fwd_connected(mosquitto_client_clean_session(client));
			shed_fwd_connected();
		}else{
			sidecar_set_conn(client);
			ev_stop_publishing(); /* until it asks with resume or snapshot */
			if(calib_on_sidecar_auth(client)){
				model_fill_unknown_expiry(); /* v5 expiries unknown so far can be read now */
			}
			inflight_on_sidecar_auth(client);
		}
		return MOSQ_ERR_SUCCESS;
	}
	if(linkin_is_id(id)){
		/* a peer's plugin (linkin.c): injects batches, nothing else */
		if(!linkin_auth(client, id, ed->username, ed->password)){
			emit_connect_rejected(id, ed->username, "auth");
			return MOSQ_ERR_AUTH;
		}
		return MOSQ_ERR_SUCCESS;
	}
	if(is_reserved_id(id)){
		log_refused_identity(id, ed->username, "client ids beginning with 'mqfed-sidecar' are "
				"reserved for the sidecar");
		emit_connect_rejected(id, ed->username, "auth");
		return MOSQ_ERR_AUTH;
	}
	if(streq(ed->username, MQFED_SIDECAR_USER)){
		/* a shadow: the sidecar acting as this client (is_shadow); never on the deny list */
		if(!proves_sidecar(client, id, ed->username, ed->password, false)){
			emit_connect_rejected(id, ed->username, "auth");
			return MOSQ_ERR_AUTH;
		}
		sidecar_vouch(client);
		pending_add(client, id, ed->username);
		inflight_on_shadow_auth(client);
		return MOSQ_ERR_SUCCESS;
	}
	if(admission_refuses()){
		/* the node drains (commands.c): a retriable network failure, tried elsewhere */
		emit_connect_rejected(id, ed->username, "draining");
		return MOSQ_ERR_UNKNOWN;
	}
	if(sessions_gate_closed() && !mosquitto_client_clean_session(client)){
		/* sessions not offered yet (commands.c): a retriable network failure */
		emit_connect_rejected(id, ed->username, "starting");
		return MOSQ_ERR_UNKNOWN;
	}
	if(deny_connect(id, mosquitto_client_clean_session(client), &refuse)){
		emit_connect_rejected(id, ed->username, "denied");
		/* refuse: CONNACK "not authorized". retry: any other error closes the socket without a
		 * CONNACK (handle_connect.c), a retriable network failure for the client. */
		return refuse ? MOSQ_ERR_AUTH : MOSQ_ERR_UNKNOWN;
	}
	pending_add(client, id, ed->username);
	return auth_grant ? MOSQ_ERR_SUCCESS : MOSQ_ERR_PLUGIN_DEFER;
}

/* v5 enhanced authentication skips BASIC_AUTH: never let it claim the sidecar's client id. */
static int on_ext_auth_start(int event, void *event_data, void *userdata)
{
	struct mosquitto_evt_extended_auth *ed = event_data;
	const char *id = mosquitto_client_id(ed->client);

	(void)event;
	(void)userdata;
	origin_event();
	if(is_reserved_id(id) || streq(mosquitto_client_username(ed->client), MQFED_SIDECAR_USER)){
		log_refused_identity(id, mosquitto_client_username(ed->client), "enhanced "
				"authentication cannot claim the sidecar's client id or username");
		emit_connect_rejected(id, mosquitto_client_username(ed->client), "auth");
		return MOSQ_ERR_AUTH;
	}
	return MOSQ_ERR_PLUGIN_DEFER;
}

/* Over the size limit: the payload beyond message_size_limit, or topic and properties beyond
 * MQFED_HEADERS_MAX (the properties are measured only when the payload fits). */
static bool oversize(const struct mosquitto_evt_message *ed)
{
	size_t headers;

	if(ed->payloadlen > size_limit) return true;
	headers = ed->topic ? strlen(ed->topic) : 0;
	if(ed->properties) headers += properties_size(ed->properties);
	return headers > MQFED_HEADERS_MAX;
}

/* Refuse a client's message over the limit before Mosquitto stores or acknowledges it.
 * MQTT v5: "denied", so the client gets PUBACK/PUBREC 0x87 for it and stays connected. MQTT
 * 3.1/3.1.1 has no negative acknowledgement (a PUBACK would say "delivered"): its publisher is
 * disconnected instead. QoS 0 is dropped (nothing is acknowledged). */
static int refuse_oversize(const struct mosquitto_evt_message *ed)
{
	bool v5 = mosquitto_client_protocol_version(ed->client) == 5;
	uint64_t held;
	char note[80];

	if(ratelog_due(&oversize_log, MQFED_REFUSAL_LOG_MS, &held)){
		mosquitto_log_printf(MOSQ_LOG_WARNING,
				"mqfed: refused a %u-byte message on '%s' from client '%s' (QoS %d, retain %d): "
				"over the cluster's message size limit (%llu bytes of payload, %u of topic and "
				"properties; mqtt.message_size_limit); %s%s",
				(unsigned)ed->payloadlen, ed->topic ? ed->topic : "",
				mosquitto_client_id(ed->client), ed->qos, ed->retain,
				(unsigned long long)size_limit, MQFED_HEADERS_MAX,
				ed->qos == 0 ? "dropped" : v5 ? "it gets reason code 0x87"
				: "disconnected it (MQTT 3 cannot refuse a message)",
				held_note(note, sizeof(note), held));
	}
	return (v5 || ed->qos == 0) ? MOSQ_ERR_ACL_DENIED : MOSQ_ERR_PAYLOAD_SIZE;
}

static int on_message(int event, void *event_data, void *userdata)
{
	struct mosquitto_evt_message *ed = event_data;
	struct mosquitto *sidecar = sidecar_conn(), *fwd = sidecar_fwd_conn();
	const char *id;
	cJSON *ev, *props;
	char *b64;

	(void)event;
	(void)userdata;
	origin_on_message(ed);
	if(size_limit > 0 && ed->client != sidecar && ed->client != fwd && !is_sidecar(ed->client)
			&& oversize(ed)){
		return refuse_oversize(ed);
	}
	/* catch-up ring (recent.c): ordinary clients' publishes, retained ones aside */
	recent_on_message(ed, !ed->retain && ed->client != sidecar && ed->client != fwd
			&& !is_sidecar(ed->client) && !is_shadow(ed->client));
	if(ed->qos > 0 && ed->client != sidecar && ed->client != fwd && !is_sidecar(ed->client)
			&& shed_publish(ed->client, ed->topic, ed->qos)){
		/* disconnected (shed.c): Mosquitto drops this publish without storing or acking it */
		return MOSQ_ERR_ADMINISTRATIVE_ACTION;
	}
	if(ed->client != fwd) journal_on_message(ed); /* before Mosquitto acks it (journal.c) */
	/* capture.c: the identity of an ordinary client's message, for the READ checks of .fwd */
	if(ed->client != sidecar && ed->client != fwd && !is_sidecar(ed->client)
			&& !is_shadow(ed->client)){
		capture_on_message(ed);
	}
	if(!ed->retain || ed->client == sidecar || ed->client == fwd || ed->topic == NULL){
		return MOSQ_ERR_SUCCESS;
	}
	pending_resolve_conn(ed->client);
	id = mosquitto_client_id(ed->client);
	if(is_sidecar_id(id)) return MOSQ_ERR_SUCCESS;
	(void)model_client_for_event(ed->client, false); /* never adopt: could be a bridge */

	ev = ev_new("retained");
	if(ev){
		cjson_add_str_or_null(ev, "client", id);
		cJSON_AddStringToObject(ev, "topic", ed->topic);
		b64 = b64_encode(ed->payload, ed->payloadlen, NULL);
		if(b64){
			cJSON_AddStringToObject(ev, "payload", b64);
			free(b64);
		}else{
			cJSON_Delete(ev);
			ev = NULL;
		}
	}
	if(ev){
		cJSON_AddNumberToObject(ev, "qos", ed->qos);
		props = properties_to_json(ed->properties);
		if(props){
			cJSON_AddItemToObject(ev, "properties", props);
		}else{
			cJSON_Delete(ev);
			ev = NULL;
		}
	}
	ev_emit(ev);
	return MOSQ_ERR_SUCCESS;
}

static void emit_heartbeat(void)
{
	cJSON *ev = ev_new("heartbeat");
	struct ev_stats st;

	ev_stats(&st);
	if(ev){
		cJSON_AddNumberToObject(ev, "clients", model_online());
		cJSON_AddNumberToObject(ev, "sessions", model_sessions());
		cJSON_AddNumberToObject(ev, "subscriptions", (double)model_subscriptions());
		/* the unacked events before this one */
		cJSON_AddNumberToObject(ev, "buffered", (double)st.buffered);
	}
	ev_emit(ev);
}

static struct mosquitto *live_conn(const char *id, bool *has_session)
{
	struct client *c = model_find(id);
	struct mosquitto *conn = c != NULL && model_client_online(c) ? model_client_conn(c) : NULL;

	*has_session = c != NULL;
	return conn != NULL && !sidecar_vouched(conn) ? conn : NULL; /* a shadow is not the client */
}

static int on_tick(int event, void *event_data, void *userdata)
{
	time_t now;
	int64_t ms;

	(void)event;
	(void)event_data;
	(void)userdata;
	origin_event();
	origin_tick();
	pending_resolve_all();
	inflight_tick(live_conn); /* first: nothing of ours may be queued before its releases */
	inject_tick();

	now = time(NULL);
	if(now != last_expiry_check){
		last_expiry_check = now;
		model_expire_sessions(now);
	}
	if(sidecar_conn()){
		ms = mono_ms();
		if(ms - last_heartbeat_ms >= heartbeat_ms){
			last_heartbeat_ms = ms;
			emit_heartbeat();
		}
	}
	hold_tick();
	subopts_tick();
	recent_tick();
	journal_tick();
	capture_tick();
	linkout_tick();
	linkin_tick();
	ev_publish_pending();
	return MOSQ_ERR_SUCCESS;
}

static int on_disconnect(int event, void *event_data, void *userdata)
{
	struct mosquitto_evt_disconnect *ed = event_data;

	(void)event;
	(void)userdata;
	origin_event();
	if(ed->client == NULL) return MOSQ_ERR_SUCCESS;
	if(linkin_conn(ed->client)){
		linkin_disconnected(ed->client);
		return MOSQ_ERR_SUCCESS;
	}
	sidecar_unvouch(ed->client);
	if(ed->client == sidecar_conn()){
		sidecar_set_conn(NULL);
		ev_stop_publishing();
		return MOSQ_ERR_SUCCESS;
	}
	if(ed->client == sidecar_fwd_conn()){
		origin_fwd_disconnect(ed->client);
		capture_fwd_disconnected(client_expiry(ed->client));
		sidecar_set_fwd_conn(NULL);
		return MOSQ_ERR_SUCCESS;
	}
	if(sidecar_fwd_shard(mosquitto_client_id(ed->client)) > 0) return MOSQ_ERR_SUCCESS;
	inject_forget(mosquitto_client_id(ed->client));
	if(model_is_live(ed->client)
			&& !streq(mosquitto_client_username(ed->client), MQFED_SIDECAR_USER)){
		/* a client leaving (not a shadow): QoS 2 messages waiting for its PUBCOMP */
		inflight_capture(ed->client, mosquitto_client_id(ed->client));
		/* its session (held live while its old node's queue comes) rings from now on */
		hold_connected(mosquitto_client_id(ed->client));
		/* what its session queues from now on is recorded, for a move (cut.c) */
		cut_on_disconnect(mosquitto_client_id(ed->client));
	}
	model_on_disconnect(ed->client);
	return MOSQ_ERR_SUCCESS;
}

static int on_control(int event, void *event_data, void *userdata)
{
	(void)event;
	(void)userdata;
	const struct mosquitto_evt_control *ed = event_data;

	origin_event();
	if(ed->topic && streq(ed->topic, MQFED_INJECT_TOPIC)) inject_on_control(ed);
	else commands_on_control(ed);
	return MOSQ_ERR_SUCCESS;
}

/* ---- entry points ---------------------------------------------------------------------- */

static void free_all(void)
{
	model_cleanup();
	origin_cleanup();
	inject_cleanup();
	recent_cleanup();
	shed_cleanup();
	journal_cleanup();
	capture_cleanup();
	linkout_cleanup();
	linkin_cleanup();
	commands_cleanup();
	hold_clear();
	subopts_cleanup();
	events_cleanup();
	calib_cleanup();
	inflight_cleanup();
	will_cleanup();
	sidecar_cleanup();
	free(secret);
	secret = NULL;
	pid = NULL;
	auth_grant = acl_grant = nested = false;
	heartbeat_ms = 0;
	size_limit = 0;
	memset(&identity_log, 0, sizeof(identity_log));
	memset(&impostor_log, 0, sizeof(impostor_log));
	memset(&oversize_log, 0, sizeof(oversize_log));
	last_heartbeat_ms = 0;
	last_expiry_check = 0;
}

#define MQFED_EXPORT __attribute__((visibility("default")))

MQFED_EXPORT int mosquitto_plugin_version(int supported_version_count, const int *supported_versions)
{
	int i;

	for(i = 0; i < supported_version_count; i++){
		if(supported_versions[i] == 5) return 5;
	}
	return -1;
}

MQFED_EXPORT int mosquitto_plugin_init(mosquitto_plugin_id_t *identifier, void **userdata,
		struct mosquitto_opt *options, int option_count)
{
	struct module_opts mo;
	int rc;

	free_all(); /* from a clean state, as after a cleanup */
	pid = identifier;
	*userdata = NULL;
	if(parse_options(options, option_count, &mo) || sidecar_init(mo.sidecar_id, mo.sidecar_socket)
			|| events_init(mo.window, mo.buf_max_events, mo.buf_max_bytes, mo.batch)){
		free_all();
		return MOSQ_ERR_INVAL;
	}
	origin_init(mo.fwd_q2_max, strtoull(ev_epoch(), NULL, 16));
	model_set_connect_listener(on_client_connect);
	shed_init(mo.fwd_backlog_max);
	recent_init(mo.catchup_ms, mo.catchup_bytes);
	journal_init(mo.journal_dir, ev_epoch(), mo.journal_max_age);
	if(capture_init(mo.capture_socket, mo.capture_max_bytes, strtoull(ev_epoch(), NULL, 16))){
		free_all();
		return MOSQ_ERR_INVAL;
	}
	if(linkin_init(mo.link_secret)){
		free_all();
		return MOSQ_ERR_NOMEM;
	}
	commands_init(mo.snapshot_chunk, mo.sessions_gate);
	inject_set_max_queued((long)mo.max_queued);
	inflight_set_max_queued((long)mo.max_queued);

	rc = mosquitto_callback_register(pid, MOSQ_EVT_BASIC_AUTH, on_basic_auth, NULL, NULL);
	if(!rc) rc = mosquitto_callback_register(pid, MOSQ_EVT_EXT_AUTH_START, on_ext_auth_start,
			NULL, NULL);
	if(!rc) rc = mosquitto_callback_register(pid, MOSQ_EVT_ACL_CHECK, on_acl_check, NULL, NULL);
	if(!rc) rc = mosquitto_callback_register(pid, MOSQ_EVT_MESSAGE, on_message, NULL, NULL);
	if(!rc) rc = mosquitto_callback_register(pid, MOSQ_EVT_TICK, on_tick, NULL, NULL);
	if(!rc) rc = mosquitto_callback_register(pid, MOSQ_EVT_DISCONNECT, on_disconnect, NULL, NULL);
	if(!rc) rc = mosquitto_callback_register(pid, MOSQ_EVT_CONTROL, on_control,
			MQFED_CONTROL_TOPIC, NULL);
	if(!rc) rc = mosquitto_callback_register(pid, MOSQ_EVT_CONTROL, on_control,
			MQFED_INJECT_TOPIC, NULL);
	if(rc){
		mosquitto_log_printf(MOSQ_LOG_ERR, "mqfed: registering callbacks failed (%d)", rc);
		free_all();
		return rc;
	}
	mosquitto_log_printf(MOSQ_LOG_NOTICE,
			"mqfed plugin %s loaded (protocol v1, epoch %s, sidecar id '%s', private socket %s, "
			"auth %s, acl %s, message size limit %llu)", MQFED_VERSION, ev_epoch(), sidecar_id(),
			sidecar_socket() ? sidecar_socket() : "any unix socket",
			auth_grant ? "grant" : "defer", acl_grant ? "grant" : "defer",
			(unsigned long long)size_limit);
	if(mosquitto__get_state == NULL){
		mosquitto_log_printf(MOSQ_LOG_WARNING,
				"mqfed: mosquitto__get_state() not exported by this broker: subscribe ACL "
				"re-checks from other plugins' kicks cannot be told from real subscribes");
	}
	return MOSQ_ERR_SUCCESS;
}

MQFED_EXPORT int mosquitto_plugin_cleanup(void *userdata, struct mosquitto_opt *options, int option_count)
{
	(void)userdata;
	(void)options;
	(void)option_count;
	if(pid){
		mosquitto_callback_unregister(pid, MOSQ_EVT_BASIC_AUTH, on_basic_auth, NULL);
		mosquitto_callback_unregister(pid, MOSQ_EVT_EXT_AUTH_START, on_ext_auth_start, NULL);
		mosquitto_callback_unregister(pid, MOSQ_EVT_ACL_CHECK, on_acl_check, NULL);
		mosquitto_callback_unregister(pid, MOSQ_EVT_MESSAGE, on_message, NULL);
		mosquitto_callback_unregister(pid, MOSQ_EVT_TICK, on_tick, NULL);
		mosquitto_callback_unregister(pid, MOSQ_EVT_DISCONNECT, on_disconnect, NULL);
		mosquitto_callback_unregister(pid, MOSQ_EVT_CONTROL, on_control, MQFED_CONTROL_TOPIC);
		mosquitto_callback_unregister(pid, MOSQ_EVT_CONTROL, on_control, MQFED_INJECT_TOPIC);
	}
	free_all();
	return MOSQ_ERR_SUCCESS;
}
