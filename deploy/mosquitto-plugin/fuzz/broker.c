/* A fake Mosquitto 2.0.11 for the fuzz target: the public broker API the plugin uses, with
 * the lifetimes Mosquitto gives client structures (a disconnected clean session is freed at
 * the next loop iteration; an offline session lives on), so AddressSanitizer sees a plugin
 * that keeps a pointer too long. Property and topic helpers come from libmosquitto. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "broker.h"

struct callback {
	MOSQ_FUNC_generic_callback cb;
	void *userdata;
};

static struct callback callbacks[MOSQ_EVT_DISCONNECT + 1];
static struct mosquitto *clients;
static int later_verdict = MOSQ_ERR_SUCCESS;
static bool verbose;

void broker_reset(void)
{
	memset(callbacks, 0, sizeof(callbacks));
	later_verdict = MOSQ_ERR_SUCCESS;
	verbose = getenv("MQFED_FUZZ_VERBOSE") != NULL;
}

static char *dup_or_null(const char *s)
{
	return s ? strdup(s) : NULL;
}

struct mosquitto *broker_new_client(const char *id, const char *username, const char *address,
		int protocol_version, bool clean_start, uint32_t expiry)
{
	struct mosquitto *c = calloc(1, sizeof(*c));

	if(c == NULL) abort();
	c->id = dup_or_null(id);
	c->username = dup_or_null(username);
	c->address = dup_or_null(address);
	c->protocol_version = protocol_version;
	c->clean_start = clean_start;
	c->keepalive = 60;
	c->state = FAKE_CS_NEW;
	c->session_expiry_interval = expiry;
	c->next = clients;
	clients = c;
	return c;
}

struct mosquitto *broker_find_live(const char *id)
{
	struct mosquitto *c;

	if(id == NULL) return NULL;
	for(c = clients; c; c = c->next){
		if(!c->doomed && c->id && strcmp(c->id, id) == 0
				&& (c->state == FAKE_CS_ACTIVE || c->state == FAKE_CS_DISCONNECTED)){
			return c;
		}
	}
	return NULL;
}

int broker_call(int event, void *event_data)
{
	if(event < 0 || event > MOSQ_EVT_DISCONNECT || callbacks[event].cb == NULL){
		return MOSQ_ERR_PLUGIN_DEFER;
	}
	return callbacks[event].cb(event, event_data, callbacks[event].userdata);
}

bool broker_has_callback(int event)
{
	return event >= 0 && event <= MOSQ_EVT_DISCONNECT && callbacks[event].cb != NULL;
}

void broker_set_later_verdict(int rc)
{
	later_verdict = rc;
}

/* context__disconnect: the DISCONNECT event, then an offline session or the disused list. */
void broker_disconnect(struct mosquitto *c, bool keep_session)
{
	struct mosquitto_evt_disconnect ed;

	if(c->doomed) return;
	memset(&ed, 0, sizeof(ed));
	ed.client = c;
	ed.reason = -1;
	broker_call(MOSQ_EVT_DISCONNECT, &ed);
	if(keep_session && c->id && c->session_expiry_interval > 0){
		c->state = FAKE_CS_DISCONNECTED;
	}else{
		c->state = FAKE_CS_DISCONNECTING;
		c->doomed = true;
	}
}

static void free_client(struct mosquitto *c)
{
	free(c->id);
	free(c->username);
	free(c->address);
	free(c);
}

void broker_free_doomed(void)
{
	struct mosquitto **p = &clients, *c;

	while((c = *p) != NULL){
		if(c->doomed){
			*p = c->next;
			free_client(c);
		}else{
			p = &c->next;
		}
	}
}

void broker_free_all(void)
{
	struct mosquitto *c;

	while((c = clients) != NULL){
		clients = c->next;
		free_client(c);
	}
}

/* ---- the broker API the plugin calls --------------------------------------------------- */

int mosquitto_callback_register(mosquitto_plugin_id_t *identifier, int event,
		MOSQ_FUNC_generic_callback cb_func, const void *event_data, void *userdata)
{
	(void)identifier;
	(void)event_data;
	if(event < 0 || event > MOSQ_EVT_DISCONNECT) return MOSQ_ERR_ALREADY_EXISTS;
	/* control callbacks are per topic in Mosquitto: the same function for several topics */
	if(callbacks[event].cb && !(event == MOSQ_EVT_CONTROL && callbacks[event].cb == cb_func)){
		return MOSQ_ERR_ALREADY_EXISTS;
	}
	callbacks[event].cb = cb_func;
	callbacks[event].userdata = userdata;
	return MOSQ_ERR_SUCCESS;
}

int mosquitto_callback_unregister(mosquitto_plugin_id_t *identifier, int event,
		MOSQ_FUNC_generic_callback cb_func, const void *event_data)
{
	(void)identifier;
	(void)event_data;
	if(event < 0 || event > MOSQ_EVT_DISCONNECT || callbacks[event].cb != cb_func){
		return MOSQ_ERR_NOT_FOUND;
	}
	callbacks[event].cb = NULL;
	return MOSQ_ERR_SUCCESS;
}

void mosquitto_log_printf(int level, const char *fmt, ...)
{
	va_list va;
	char buf[1024];

	va_start(va, fmt);
	vsnprintf(buf, sizeof(buf), fmt, va); /* formats every argument: UBSan/ASan check them */
	va_end(va);
	if(verbose) fprintf(stderr, "[%d] %s\n", level, buf);
}

void mosquitto_free(void *mem)
{
	free(mem);
}

/* mosquitto_broker_publish_copy: copies the payload, takes the properties (freed here, as
 * Mosquitto frees them once it sent the message); invalid arguments leave them to the caller. */
int mosquitto_broker_publish_copy(const char *clientid, const char *topic, int payloadlen,
		const void *payload, int qos, bool retain, mosquitto_property *properties)
{
	void *copy;

	(void)clientid;
	(void)retain;
	if(topic == NULL || payloadlen < 0 || (payloadlen > 0 && payload == NULL) || qos < 0
			|| qos > 2){
		return MOSQ_ERR_INVAL;
	}
	copy = calloc(1, (size_t)payloadlen + 1);
	if(copy == NULL) return MOSQ_ERR_NOMEM;
	if(payloadlen) memcpy(copy, payload, (size_t)payloadlen);
	free(copy);
	mosquitto_property_free_all(&properties);
	return MOSQ_ERR_SUCCESS;
}

int mosquitto_kick_client_by_clientid(const char *clientid, bool with_will)
{
	struct mosquitto *c = broker_find_live(clientid);

	(void)with_will;
	if(c == NULL || c->state != FAKE_CS_ACTIVE) return MOSQ_ERR_SUCCESS;
	broker_disconnect(c, true);
	return MOSQ_ERR_SUCCESS;
}

const char *mosquitto_client_address(const struct mosquitto *client)
{
	return client ? client->address : NULL;
}

bool mosquitto_client_clean_session(const struct mosquitto *client)
{
	return client ? client->clean_start : true;
}

const char *mosquitto_client_id(const struct mosquitto *client)
{
	return client ? client->id : NULL;
}

int mosquitto_client_keepalive(const struct mosquitto *client)
{
	return client ? client->keepalive : 0;
}

int mosquitto_client_protocol_version(const struct mosquitto *client)
{
	return client ? client->protocol_version : 0;
}

int mosquitto_client_sub_count(const struct mosquitto *client)
{
	return client ? client->sub_count : 0;
}

const char *mosquitto_client_username(const struct mosquitto *client)
{
	return client ? client->username : NULL;
}

/* Internal symbols the plugin resolves weakly. */
int mosquitto__get_state(struct mosquitto *mosq)
{
	return mosq->state;
}

int mosquitto_acl_check(struct mosquitto *context, const char *topic, uint32_t payloadlen,
		void *payload, uint8_t qos, bool retain, int access)
{
	struct mosquitto_evt_acl_check ed;
	int rc;

	memset(&ed, 0, sizeof(ed));
	ed.client = context;
	ed.topic = topic;
	ed.payload = payload;
	ed.payloadlen = payloadlen;
	ed.qos = qos;
	ed.retain = retain;
	ed.access = access;
	rc = broker_call(MOSQ_EVT_ACL_CHECK, &ed); /* the plugin itself, nested: it defers */
	return rc == MOSQ_ERR_PLUGIN_DEFER ? later_verdict : rc;
}
