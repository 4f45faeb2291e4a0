/* mqfed Mosquitto plugin: entry points, options, access decisions and the event callbacks.
 * The only module that wires the others to Mosquitto (util.h lists them, lowest first).
 * Contract: docs/plugin-protocol.md. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "calib.h"
#include "commands.h"
#include "events.h"
#include "hold.h"
#include "model.h"
#include "origin.h"
#include "recent.h"
#include "shed.h"
#include "sidecar.h"
#include "util.h"

#define MQFED_VERSION "0.1.0"
#define MQFED_CONTROL_TOPIC "$CONTROL/mqfed/v1"
#define MQFED_SIDECAR_USER "mqfed-sidecar"

/* Options of the other modules, handed to their init. */
struct module_opts {
	const char *sidecar_id;
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
};

static mosquitto_plugin_id_t *pid;

/* options */
static char *secret;
static bool auth_grant;
static bool acl_grant;
static long heartbeat_ms;

/* our own ACL check asked again while it runs (later_verdict) */
static bool nested;

/* timers */
static int64_t last_heartbeat_ms;
static time_t last_expiry_check;

/* Internal to Mosquitto but exported by the 2.0.11 broker binary. Weak, so a build without it
 * still loads; used only to tell the subscribe ACL re-check of a kick (client state no longer
 * "active") from a real SUBSCRIBE packet (handle_subscribe.c requires state active). */
extern int mosquitto__get_state(struct mosquitto *mosq) __attribute__((weak));
#define MOSQ_CS_ACTIVE 3 /* enum mosquitto_client_state in lib/mosquitto_internal.h */
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

	for(i = 0; i < count; i++){
		const char *k = opts[i].key;
		const char *val = opts[i].value ? opts[i].value : "";

		if(streq(k, "sidecar_secret")){
			free(secret);
			secret = strdup(val);
		}else if(streq(k, "sidecar_id")){
			mo->sidecar_id = val;
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

static bool secret_ok(const char *password)
{
	size_t a, b, i;
	unsigned char diff = 0;

	if(password == NULL) return false;
	a = strlen(password);
	b = strlen(secret);
	for(i = 0; i < a && i < b; i++){
		diff |= (unsigned char)(password[i] ^ secret[i]);
	}
	return diff == 0 && a == b;
}

/* The sidecar for ACL purposes. Besides its live connection, Mosquitto also checks on behalf of
 * the sidecar's OFFLINE session (queueing cluster messages for it while it restarts) and, with
 * check_retain_source, on a stack copy of the original publisher of a retained message. Those are
 * not live connections (state not "active") and carry the sidecar's client id and username, which
 * no other connection can get: BASIC_AUTH and EXT_AUTH_START refuse them without the secret. */
static bool is_sidecar(struct mosquitto *client)
{
	if(client == NULL) return false;
	if(client == sidecar_conn() || client == sidecar_fwd_conn()) return true;
	if(mosquitto__get_state == NULL || mosquitto__get_state(client) == MOSQ_CS_ACTIVE) return false;
	return is_sidecar_id(mosquitto_client_id(client))
		&& streq(mosquitto_client_username(client), MQFED_SIDECAR_USER);
}

/* A shadow (sessions.md): the sidecar acting as client C to make, drain or delete C's
 * session here. Its username is the sidecar's, which only the secret obtains (BASIC_AUTH) and
 * which enhanced authentication cannot claim; also true of the offline session it leaves. */
static bool is_shadow(struct mosquitto *client)
{
	const char *id;

	if(client == NULL || client == sidecar_conn() || client == sidecar_fwd_conn()) return false;
	id = mosquitto_client_id(client);
	return id != NULL && !is_sidecar_id(id)
		&& streq(mosquitto_client_username(client), MQFED_SIDECAR_USER);
}

/* The forwarding connection or its offline session (given is_sidecar). */
static bool is_fwd(struct mosquitto *client)
{
	return client == sidecar_fwd_conn() || streq(mosquitto_client_id(client), sidecar_fwd_id());
}

/* What shed.c needs to know: the filters .fwd subscribes to, and the copies routed to it. */
static void on_fwd_acl(const struct mosquitto_evt_acl_check *ed)
{
	if(ed->topic == NULL) return;
	switch(ed->access){
		case MOSQ_ACL_SUBSCRIBE:
			shed_fwd_filter(ed->topic, true);
			recent_fwd_filter(ed->topic, true);
			break;
		case MOSQ_ACL_UNSUBSCRIBE:
			shed_fwd_filter(ed->topic, false);
			recent_fwd_filter(ed->topic, false);
			break;
		case MOSQ_ACL_READ:
			/* not the re-check of its queued messages while .fwd connects (state not yet
			 * active, handle_connect.c): those were counted when they were routed */
			if(ed->client == sidecar_fwd_conn() && mosquitto__get_state
					&& mosquitto__get_state(ed->client) != MOSQ_CS_ACTIVE){
				break;
			}
			shed_fwd_routed(ed->qos);
			break;
		default:
			break;
	}
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
	}else{
		model_unsubscribe(c, filter);
	}
}

static int on_acl_check(int event, void *event_data, void *userdata)
{
	struct mosquitto_evt_acl_check *ed = event_data;
	int pass = acl_grant ? MOSQ_ERR_SUCCESS : MOSQ_ERR_PLUGIN_DEFER;
	bool shadow;

	(void)event;
	(void)userdata;
	if(nested) return MOSQ_ERR_PLUGIN_DEFER;
	if(ed->access == MOSQ_ACL_READ){
		/* a message re-injected by .fwd never goes to a shared subscription (origin.c) */
		if(origin_read_denied(ed->client, ed->topic, ed->payload, ed->payloadlen, ed->qos,
					ed->retain)){
			return MOSQ_ERR_ACL_DENIED;
		}
		/* catch-up: note the routing; the control connection's `#` only observes (recent.c) */
		if(recent_read(ed->client, ed->topic, ed->payload, ed->payloadlen, ed->qos, ed->retain)){
			return MOSQ_ERR_ACL_DENIED;
		}
	}else{
		origin_event();
	}
	if(is_sidecar(ed->client)){
		if(is_fwd(ed->client)) on_fwd_acl(ed);
		else if(ed->access == MOSQ_ACL_SUBSCRIBE) recent_sidecar_checks();
		return MOSQ_ERR_SUCCESS;
	}
	if(ed->topic == NULL) return pass;
	/* a shadow makes the subscriptions its client had on another node, where they were
	 * checked; its session's queued messages are the client's: granted, and reported */
	shadow = is_shadow(ed->client);
	if(ed->access == MOSQ_ACL_READ && mosquitto__get_state
			&& mosquitto__get_state(ed->client) == MOSQ_CS_DISCONNECTED
			&& hold_refuses(mosquitto_client_id(ed->client), ed->topic, ed->payload,
				ed->payloadlen, ed->qos)){
		/* An offline session the sidecar holds queues nothing (`hold`): its client is
		 * served by another node, or a shadow made it here ahead of its client, while the
		 * node the client comes from still queues for it (and hands that over: never
		 * twice); a replica's ring hold keeps it for a while (hold.c). A connect re-checks
		 * the queue as another context, so that passes. */
		return MOSQ_ERR_ACL_DENIED;
	}
	if(shadow && ed->access != MOSQ_ACL_WRITE) pass = MOSQ_ERR_SUCCESS;

	switch(ed->access){
		case MOSQ_ACL_SUBSCRIBE:
			if(topic_in_subtree(strip_share(ed->topic), "$SYS/broker/mqfed")){
				return MOSQ_ERR_ACL_DENIED;
			}
			on_sub_acl(ed->client, ed->topic, ed->qos, ed->access, shadow);
			return pass;
		case MOSQ_ACL_UNSUBSCRIBE:
			on_sub_acl(ed->client, ed->topic, ed->qos, ed->access, shadow);
			return pass;
		case MOSQ_ACL_READ:
			if(topic_in_subtree(ed->topic, "$SYS/broker/mqfed")) return MOSQ_ERR_ACL_DENIED;
			return pass;
		case MOSQ_ACL_WRITE:
			if(topic_in_subtree(ed->topic, "$CONTROL/mqfed")) return MOSQ_ERR_ACL_DENIED;
			return pass;
		default:
			return pass;
	}
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
		if(!streq(ed->username, MQFED_SIDECAR_USER) || !secret_ok(ed->password)){
			mosquitto_log_printf(MOSQ_LOG_WARNING,
					"mqfed: refused a connection using the sidecar's client id '%s' without its "
					"credentials", id);
			emit_connect_rejected(id, ed->username, "auth");
			return MOSQ_ERR_AUTH;
		}
		if(streq(id, sidecar_fwd_id())){
			sidecar_set_fwd_conn(client);
			origin_fwd_auth(client);
			shed_fwd_connected();
		}else{
			sidecar_set_conn(client);
			ev_stop_publishing(); /* until it asks with resume or snapshot */
			if(calib_on_sidecar_auth(client)){
				model_fill_unknown_expiry(); /* v5 expiries unknown so far can be read now */
			}
		}
		return MOSQ_ERR_SUCCESS;
	}
	if(streq(ed->username, MQFED_SIDECAR_USER)){
		/* a shadow: the sidecar acting as this client (is_shadow); never on the deny list */
		if(!secret_ok(ed->password)){
			mosquitto_log_printf(MOSQ_LOG_WARNING,
					"mqfed: refused client '%s' using the sidecar's username without its "
					"secret", id);
			emit_connect_rejected(id, ed->username, "auth");
			return MOSQ_ERR_AUTH;
		}
		pending_add(client, id, ed->username);
		return MOSQ_ERR_SUCCESS;
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
	if(is_sidecar_id(id) || streq(mosquitto_client_username(ed->client), MQFED_SIDECAR_USER)){
		mosquitto_log_printf(MOSQ_LOG_WARNING,
				"mqfed: refused enhanced authentication using the sidecar's client id or "
				"username ('%s')", id);
		emit_connect_rejected(id, mosquitto_client_username(ed->client), "auth");
		return MOSQ_ERR_AUTH;
	}
	return MOSQ_ERR_PLUGIN_DEFER;
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
	/* catch-up ring (recent.c): ordinary clients' publishes, retained ones aside */
	recent_on_message(ed, !ed->retain && ed->client != sidecar && ed->client != fwd
			&& !is_sidecar(ed->client) && !is_shadow(ed->client));
	if(ed->qos > 0 && ed->client != sidecar && ed->client != fwd && !is_sidecar(ed->client)
			&& shed_publish(ed->client, ed->topic, ed->qos)){
		/* disconnected (shed.c): Mosquitto drops this publish without storing or acking it */
		return MOSQ_ERR_ADMINISTRATIVE_ACTION;
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

	now = time(NULL);
	if(now != last_expiry_check){
		last_expiry_check = now;
		model_expire_sessions(now);
	}
	if(sidecar_conn()){
		ms = now_ms();
		if(ms - last_heartbeat_ms >= heartbeat_ms || ms < last_heartbeat_ms){
			last_heartbeat_ms = ms;
			emit_heartbeat();
		}
	}
	hold_tick();
	recent_tick();
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
	if(ed->client == sidecar_conn()){
		sidecar_set_conn(NULL);
		ev_stop_publishing();
		return MOSQ_ERR_SUCCESS;
	}
	if(ed->client == sidecar_fwd_conn()){
		origin_fwd_disconnect(ed->client);
		sidecar_set_fwd_conn(NULL);
		return MOSQ_ERR_SUCCESS;
	}
	model_on_disconnect(ed->client);
	return MOSQ_ERR_SUCCESS;
}

static int on_control(int event, void *event_data, void *userdata)
{
	(void)event;
	(void)userdata;
	origin_event();
	commands_on_control(event_data);
	return MOSQ_ERR_SUCCESS;
}

/* ---- entry points ---------------------------------------------------------------------- */

static void free_all(void)
{
	model_cleanup();
	origin_cleanup();
	recent_cleanup();
	shed_cleanup();
	commands_cleanup();
	hold_clear();
	events_cleanup();
	calib_cleanup();
	sidecar_cleanup();
	free(secret);
	secret = NULL;
	pid = NULL;
	auth_grant = acl_grant = nested = false;
	heartbeat_ms = 0;
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
	if(parse_options(options, option_count, &mo) || sidecar_init(mo.sidecar_id)
			|| events_init(mo.window, mo.buf_max_events, mo.buf_max_bytes, mo.batch)){
		free_all();
		return MOSQ_ERR_INVAL;
	}
	origin_init(mo.fwd_q2_max, strtoull(ev_epoch(), NULL, 16));
	shed_init(mo.fwd_backlog_max);
	recent_init(mo.catchup_ms, mo.catchup_bytes);
	commands_init(mo.snapshot_chunk, mo.sessions_gate);

	rc = mosquitto_callback_register(pid, MOSQ_EVT_BASIC_AUTH, on_basic_auth, NULL, NULL);
	if(!rc) rc = mosquitto_callback_register(pid, MOSQ_EVT_EXT_AUTH_START, on_ext_auth_start,
			NULL, NULL);
	if(!rc) rc = mosquitto_callback_register(pid, MOSQ_EVT_ACL_CHECK, on_acl_check, NULL, NULL);
	if(!rc) rc = mosquitto_callback_register(pid, MOSQ_EVT_MESSAGE, on_message, NULL, NULL);
	if(!rc) rc = mosquitto_callback_register(pid, MOSQ_EVT_TICK, on_tick, NULL, NULL);
	if(!rc) rc = mosquitto_callback_register(pid, MOSQ_EVT_DISCONNECT, on_disconnect, NULL, NULL);
	if(!rc) rc = mosquitto_callback_register(pid, MOSQ_EVT_CONTROL, on_control,
			MQFED_CONTROL_TOPIC, NULL);
	if(rc){
		mosquitto_log_printf(MOSQ_LOG_ERR, "mqfed: registering callbacks failed (%d)", rc);
		free_all();
		return rc;
	}
	mosquitto_log_printf(MOSQ_LOG_NOTICE,
			"mqfed plugin %s loaded (protocol v1, epoch %s, sidecar id '%s', auth %s, acl %s)",
			MQFED_VERSION, ev_epoch(), sidecar_id(), auth_grant ? "grant" : "defer",
			acl_grant ? "grant" : "defer");
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
	}
	free_all();
	return MOSQ_ERR_SUCCESS;
}
