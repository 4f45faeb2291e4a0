/* mqfed Mosquitto plugin: entry points, options, access decisions and the event callbacks.
 * Contract: docs/plugin-protocol.md. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "mqfed.h"

struct mqfed g;

/* Internal to Mosquitto but exported by the 2.0.11 broker binary. Weak, so a build without it
 * still loads; used only to tell the subscribe ACL re-check of a kick (client state no longer
 * "active") from a real SUBSCRIBE packet (handle_subscribe.c requires state active). */
extern int mosquitto__get_state(struct mosquitto *mosq) __attribute__((weak));
#define MOSQ_CS_ACTIVE 3 /* enum mosquitto_client_state in lib/mosquitto_internal.h */

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

static int parse_options(struct mosquitto_opt *opts, int count)
{
	int i;
	uint64_t v;

	g.auth_grant = true;
	g.acl_grant = true;
	g.window = 500;
	g.buf_max_events = 1000000;
	g.buf_max_bytes = 268435456;
	g.heartbeat_ms = 1000;
	g.snapshot_chunk = 500;
	g.fwd_q2_max = 65535;
	g.fwd_backlog_max = 0;

	for(i = 0; i < count; i++){
		const char *k = opts[i].key;
		const char *val = opts[i].value ? opts[i].value : "";

		if(streq(k, "sidecar_secret")){
			free(g.secret);
			g.secret = strdup(val);
		}else if(streq(k, "sidecar_id")){
			free(g.sidecar_id);
			g.sidecar_id = strdup(val);
		}else if(streq(k, "auth")){
			if(parse_mode(k, val, &g.auth_grant)) return -1;
		}else if(streq(k, "acl")){
			if(parse_mode(k, val, &g.acl_grant)) return -1;
		}else if(streq(k, "event_window")){
			if(parse_u64(k, val, 1, 1000000, &g.window)) return -1;
		}else if(streq(k, "buffer_max_events")){
			if(parse_u64(k, val, 1, UINT32_MAX, &g.buf_max_events)) return -1;
		}else if(streq(k, "buffer_max_bytes")){
			if(parse_u64(k, val, 1024, UINT64_MAX / 2, &g.buf_max_bytes)) return -1;
		}else if(streq(k, "heartbeat_ms")){
			if(parse_u64(k, val, 10, 3600000, &v)) return -1;
			g.heartbeat_ms = (long)v;
		}else if(streq(k, "snapshot_chunk")){
			if(parse_u64(k, val, 1, 1000000, &v)) return -1;
			g.snapshot_chunk = (unsigned)v;
		}else if(streq(k, "fwd_qos2_max")){
			if(parse_u64(k, val, 1, 1000000, &g.fwd_q2_max)) return -1;
		}else if(streq(k, "fwd_backlog_max")){
			if(parse_u64(k, val, 0, UINT32_MAX, &g.fwd_backlog_max)) return -1;
		}else{
			mosquitto_log_printf(MOSQ_LOG_WARNING, "mqfed: unknown option plugin_opt_%s ignored", k);
		}
	}
	if(g.secret == NULL || g.secret[0] == '\0'){
		mosquitto_log_printf(MOSQ_LOG_ERR,
				"mqfed: plugin_opt_sidecar_secret is required; refusing to load");
		return -1;
	}
	if(g.sidecar_id == NULL){
		g.sidecar_id = strdup("mqfed-sidecar");
	}
	if(g.sidecar_id == NULL || g.sidecar_id[0] == '\0'){
		mosquitto_log_printf(MOSQ_LOG_ERR, "mqfed: plugin_opt_sidecar_id must not be empty");
		return -1;
	}
	g.fwd_id = malloc(strlen(g.sidecar_id) + sizeof(MQFED_FWD_SUFFIX));
	if(g.fwd_id == NULL) return -1;
	strcpy(g.fwd_id, g.sidecar_id);
	strcat(g.fwd_id, MQFED_FWD_SUFFIX);
	return 0;
}

static void make_epoch(void)
{
	unsigned char rnd[8];
	size_t got = 0;
	int fd = open("/dev/urandom", O_RDONLY | O_CLOEXEC);
	int i;

	if(fd >= 0){
		while(got < sizeof(rnd)){
			ssize_t n = read(fd, rnd + got, sizeof(rnd) - got);
			if(n <= 0) break;
			got += (size_t)n;
		}
		close(fd);
	}
	if(got < sizeof(rnd)){
		uint64_t x = (uint64_t)now_ms() ^ ((uint64_t)getpid() << 32);
		memcpy(rnd, &x, sizeof(rnd));
	}
	for(i = 0; i < 8; i++){
		snprintf(g.epoch + 2 * i, 3, "%02x", rnd[i]);
	}
}

/* ---- access ---------------------------------------------------------------------------- */

static bool secret_ok(const char *password)
{
	size_t a, b, i;
	unsigned char diff = 0;

	if(password == NULL) return false;
	a = strlen(password);
	b = strlen(g.secret);
	for(i = 0; i < a && i < b; i++){
		diff |= (unsigned char)(password[i] ^ g.secret[i]);
	}
	return diff == 0 && a == b;
}

/* The sidecar for ACL purposes. Besides its live connection, Mosquitto also checks on behalf of
 * the sidecar's OFFLINE session (queueing cluster messages for it while it restarts) and, with
 * check_retain_source, on a stack copy of the original publisher of a retained message. Those are
 * not live connections (state not "active") and carry the sidecar's client id and username, which
 * no other connection can get: BASIC_AUTH and EXT_AUTH_START refuse them without the secret. */
bool is_sidecar_id(const char *id)
{
	return id != NULL && (streq(id, g.sidecar_id) || streq(id, g.fwd_id));
}

static bool is_sidecar(struct mosquitto *client)
{
	if(client == NULL) return false;
	if(client == g.sidecar || client == g.fwd) return true;
	if(mosquitto__get_state == NULL || mosquitto__get_state(client) == MOSQ_CS_ACTIVE) return false;
	return is_sidecar_id(mosquitto_client_id(client))
		&& streq(mosquitto_client_username(client), MQFED_SIDECAR_USER);
}

/* The forwarding connection or its offline session (given is_sidecar). */
static bool is_fwd(struct mosquitto *client)
{
	return client == g.fwd || streq(mosquitto_client_id(client), g.fwd_id);
}

/* What shed.c needs to know: the filters .fwd subscribes to, and the copies routed to it. */
static void on_fwd_acl(const struct mosquitto_evt_acl_check *ed)
{
	if(ed->topic == NULL) return;
	switch(ed->access){
		case MOSQ_ACL_SUBSCRIBE:
			shed_fwd_filter(ed->topic, true);
			break;
		case MOSQ_ACL_UNSUBSCRIBE:
			shed_fwd_filter(ed->topic, false);
			break;
		case MOSQ_ACL_READ:
			/* not the re-check of its queued messages while .fwd connects (state not yet
			 * active, handle_connect.c): those were counted when they were routed */
			if(ed->client == g.fwd && mosquitto__get_state
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
	if(client == g.kicking) return true;
	if(mosquitto__get_state && mosquitto__get_state(client) != MOSQ_CS_ACTIVE) return true;
	return false;
}

/* What the rest of the chain (the providers after us) decides, by asking Mosquitto again while
 * our own callback defers. Only needed in defer mode; in grant mode we are the decision. */
static int later_verdict(struct mosquitto *client, const char *topic, uint8_t qos, int access)
{
	int rc;

	if(g.acl_grant || mosquitto_acl_check == NULL) return MOSQ_ERR_SUCCESS;
	g.nested = true;
	rc = mosquitto_acl_check(client, topic, 0, NULL, qos, false, access);
	g.nested = false;
	return rc;
}

static void on_sub_acl(struct mosquitto *client, const char *filter, uint8_t qos, int access)
{
	struct client *c;
	const char *id;

	if(is_recheck(client)){
		/* Not a SUBSCRIBE packet: Debian's CVE-2021-34434 fix re-checks (qos 0) every
		 * subscription of a persistent client being kicked and silently removes the denied
		 * ones. Nothing changes unless the rest of the chain now denies it. */
		struct pending *p = pending_find(client);

		if(p) pending_resolve(p); /* accepted: it is being kicked after connecting */
		if(access != MOSQ_ACL_SUBSCRIBE) return;
		if(later_verdict(client, filter, qos, access) == MOSQ_ERR_SUCCESS) return;
		id = mosquitto_client_id(client);
		c = model_find(id);
		if(c && (c->conn == client || !c->online)){
			model_unsubscribe(c, filter);
		}
		return;
	}
	if(later_verdict(client, filter, qos, access) != MOSQ_ERR_SUCCESS){
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
	int pass = g.acl_grant ? MOSQ_ERR_SUCCESS : MOSQ_ERR_PLUGIN_DEFER;

	(void)event;
	(void)userdata;
	if(g.nested) return MOSQ_ERR_PLUGIN_DEFER;
	if(ed->access == MOSQ_ACL_READ){
		/* a message re-injected by .fwd never goes to a shared subscription (origin.c) */
		if(origin_read_denied(ed->client, ed->topic, ed->payload, ed->payloadlen, ed->qos,
					ed->retain)){
			return MOSQ_ERR_ACL_DENIED;
		}
	}else{
		origin_event();
	}
	if(is_sidecar(ed->client)){
		if(is_fwd(ed->client)) on_fwd_acl(ed);
		return MOSQ_ERR_SUCCESS;
	}
	if(ed->topic == NULL) return pass;

	switch(ed->access){
		case MOSQ_ACL_SUBSCRIBE:
			if(topic_in_subtree(strip_share(ed->topic), "$SYS/broker/mqfed")){
				return MOSQ_ERR_ACL_DENIED;
			}
			on_sub_acl(ed->client, ed->topic, ed->qos, ed->access);
			return pass;
		case MOSQ_ACL_UNSUBSCRIBE:
			on_sub_acl(ed->client, ed->topic, ed->qos, ed->access);
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
	struct deny *d;

	(void)event;
	(void)userdata;
	origin_event();
	if(id == NULL){
		return g.auth_grant ? MOSQ_ERR_SUCCESS : MOSQ_ERR_PLUGIN_DEFER;
	}
	if(is_sidecar_id(id)){
		if(!streq(ed->username, MQFED_SIDECAR_USER) || !secret_ok(ed->password)){
			mosquitto_log_printf(MOSQ_LOG_WARNING,
					"mqfed: refused a connection using the sidecar's client id '%s' without its "
					"credentials", id);
			emit_connect_rejected(id, ed->username, "auth");
			return MOSQ_ERR_AUTH;
		}
		if(streq(id, g.fwd_id)){
			g.fwd = client;
			origin_fwd_auth(client);
			shed_fwd_connected();
		}else{
			g.sidecar = client;
			g.publishing = false; /* until it asks with resume or snapshot */
			calib_on_sidecar_auth(client);
		}
		return MOSQ_ERR_SUCCESS;
	}
	d = deny_find(id);
	if(d){
		g.denied_connects++;
		emit_connect_rejected(id, ed->username, "denied");
		/* refuse: CONNACK "not authorized". retry: any other error closes the socket without a
		 * CONNACK (handle_connect.c), a retriable network failure for the client. */
		return d->refuse ? MOSQ_ERR_AUTH : MOSQ_ERR_UNKNOWN;
	}
	pending_add(client, id, ed->username);
	return g.auth_grant ? MOSQ_ERR_SUCCESS : MOSQ_ERR_PLUGIN_DEFER;
}

/* v5 enhanced authentication skips BASIC_AUTH: never let it claim the sidecar's client id. */
static int on_ext_auth_start(int event, void *event_data, void *userdata)
{
	struct mosquitto_evt_extended_auth *ed = event_data;
	const char *id = mosquitto_client_id(ed->client);

	(void)event;
	(void)userdata;
	origin_event();
	if(is_sidecar_id(id)){
		mosquitto_log_printf(MOSQ_LOG_WARNING,
				"mqfed: refused enhanced authentication using the sidecar's client id '%s'", id);
		emit_connect_rejected(id, mosquitto_client_username(ed->client), "auth");
		return MOSQ_ERR_AUTH;
	}
	return MOSQ_ERR_PLUGIN_DEFER;
}

static int on_message(int event, void *event_data, void *userdata)
{
	struct mosquitto_evt_message *ed = event_data;
	struct pending *p;
	const char *id;
	cJSON *ev, *props;
	char *b64;

	(void)event;
	(void)userdata;
	origin_on_message(ed);
	if(ed->qos > 0 && ed->client != g.sidecar && ed->client != g.fwd && !is_sidecar(ed->client)
			&& shed_publish(ed->client, ed->topic, ed->qos)){
		/* disconnected (shed.c): Mosquitto drops this publish without storing or acking it */
		return MOSQ_ERR_ADMINISTRATIVE_ACTION;
	}
	if(!ed->retain || ed->client == g.sidecar || ed->client == g.fwd || ed->topic == NULL){
		return MOSQ_ERR_SUCCESS;
	}
	p = pending_find(ed->client);
	if(p) pending_resolve(p);
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

	if(ev){
		cJSON_AddNumberToObject(ev, "clients", g.n_online);
		cJSON_AddNumberToObject(ev, "sessions", model_sessions());
		cJSON_AddNumberToObject(ev, "subscriptions", (double)g.n_subs);
		/* the unacked events before this one */
		cJSON_AddNumberToObject(ev, "buffered", (double)g.ring_len);
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
	if(g.pending) pending_resolve_all();

	now = time(NULL);
	if(now != g.last_expiry_check){
		g.last_expiry_check = now;
		model_expire_sessions(now);
	}
	if(g.sidecar){
		ms = now_ms();
		if(ms - g.last_heartbeat_ms >= g.heartbeat_ms || ms < g.last_heartbeat_ms){
			g.last_heartbeat_ms = ms;
			emit_heartbeat();
		}
	}
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
	if(ed->client == g.sidecar){
		g.sidecar = NULL;
		g.publishing = false;
		return MOSQ_ERR_SUCCESS;
	}
	if(ed->client == g.fwd){
		origin_fwd_disconnect(ed->client);
		g.fwd = NULL;
		return MOSQ_ERR_SUCCESS;
	}
	model_on_disconnect(ed->client);
	return MOSQ_ERR_SUCCESS;
}

/* ---- entry points ---------------------------------------------------------------------- */

static void free_all(void)
{
	model_cleanup();
	origin_cleanup();
	shed_cleanup();
	deny_cleanup();
	events_cleanup();
	free(g.secret);
	free(g.sidecar_id);
	free(g.fwd_id);
	memset(&g, 0, sizeof(g));
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
	int rc;

	memset(&g, 0, sizeof(g));
	g.pid = identifier;
	*userdata = NULL;
	if(parse_options(options, option_count) || events_init()){
		free_all();
		return MOSQ_ERR_INVAL;
	}
	make_epoch();
	g.hash_seed = strtoull(g.epoch, NULL, 16);

	rc = mosquitto_callback_register(g.pid, MOSQ_EVT_BASIC_AUTH, on_basic_auth, NULL, NULL);
	if(!rc) rc = mosquitto_callback_register(g.pid, MOSQ_EVT_EXT_AUTH_START, on_ext_auth_start,
			NULL, NULL);
	if(!rc) rc = mosquitto_callback_register(g.pid, MOSQ_EVT_ACL_CHECK, on_acl_check, NULL, NULL);
	if(!rc) rc = mosquitto_callback_register(g.pid, MOSQ_EVT_MESSAGE, on_message, NULL, NULL);
	if(!rc) rc = mosquitto_callback_register(g.pid, MOSQ_EVT_TICK, on_tick, NULL, NULL);
	if(!rc) rc = mosquitto_callback_register(g.pid, MOSQ_EVT_DISCONNECT, on_disconnect, NULL, NULL);
	if(!rc) rc = mosquitto_callback_register(g.pid, MOSQ_EVT_CONTROL, on_control,
			MQFED_CONTROL_TOPIC, NULL);
	if(rc){
		mosquitto_log_printf(MOSQ_LOG_ERR, "mqfed: registering callbacks failed (%d)", rc);
		free_all();
		return rc;
	}
	mosquitto_log_printf(MOSQ_LOG_NOTICE,
			"mqfed plugin %s loaded (protocol v1, epoch %s, sidecar id '%s', auth %s, acl %s)",
			MQFED_VERSION, g.epoch, g.sidecar_id, g.auth_grant ? "grant" : "defer",
			g.acl_grant ? "grant" : "defer");
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
	if(g.pid){
		mosquitto_callback_unregister(g.pid, MOSQ_EVT_BASIC_AUTH, on_basic_auth, NULL);
		mosquitto_callback_unregister(g.pid, MOSQ_EVT_EXT_AUTH_START, on_ext_auth_start, NULL);
		mosquitto_callback_unregister(g.pid, MOSQ_EVT_ACL_CHECK, on_acl_check, NULL);
		mosquitto_callback_unregister(g.pid, MOSQ_EVT_MESSAGE, on_message, NULL);
		mosquitto_callback_unregister(g.pid, MOSQ_EVT_TICK, on_tick, NULL);
		mosquitto_callback_unregister(g.pid, MOSQ_EVT_DISCONNECT, on_disconnect, NULL);
		mosquitto_callback_unregister(g.pid, MOSQ_EVT_CONTROL, on_control, MQFED_CONTROL_TOPIC);
	}
	free_all();
	return MOSQ_ERR_SUCCESS;
}
