/*
 * mqfed Mosquitto plugin: what every module shares (headers, small helpers of util.c).
 *
 * Modules, each with its own header, lowest first; a module includes only headers of modules
 * before it, and keeps its state static: util, ftrie, sidecar, events, calib, will, inflight,
 * model, subopts, shed, cut, origin, batch, inject, linkin, room, linkout, recent, journal,
 * capbuf, capture, hold, commands, plugin (which alone wires them to Mosquitto's callbacks).
 *
 * The plugin is single threaded: Mosquitto 2.0 calls every callback from its main loop.
 * The contract with the sidecar is docs/plugin-protocol.md.
 */
#ifndef MQFED_UTIL_H
#define MQFED_UTIL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <time.h>

#include <cjson/cJSON.h>
#include <mosquitto.h>
#include <mosquitto_broker.h>
#include <mosquitto_plugin.h>
#include <mqtt_protocol.h>

#include "uthash.h"

/* One rate-limited kind of log line (ratelog_due). */
struct ratelog {
	int64_t last_ms;
	uint64_t held;             /* lines held back since the last one logged */
	bool logged;
};

int64_t now_ms(void);
int64_t mono_ms(void);
bool ratelog_due(struct ratelog *r, int64_t period_ms, uint64_t *held);
uint64_t hlc_next(uint64_t *last);
bool secret_equal(const char *given, const char *expected);
char *xstrdup(const char *s);
bool streq(const char *a, const char *b);
char *b64_encode(const void *data, size_t len, size_t *out_len);
int b64_decode(const char *in, unsigned char **out, size_t *out_len);
bool topic_in_subtree(const char *topic, const char *root);
const char *strip_share(const char *filter);
uint64_t hash_bytes(uint64_t h, const void *data, size_t len);
void cjson_add_str_or_null(cJSON *o, const char *key, const char *v);
const char *cjson_get_str(const cJSON *o, const char *key);
void cjson_add_expiry(cJSON *o, const char *key, int64_t v);
cJSON *properties_to_json(const mosquitto_property *props);
size_t properties_size(const mosquitto_property *props);
int properties_from_json(const cJSON *j, mosquitto_property **props);

/* A message object of the protocol: `topic` (valid for PUBLISH), `payload` (base64), `qos`
 * (0-2), optional `properties`, optional `subscription_ids` (the Subscription Identifiers a
 * targeted message carries to its client, as Mosquitto had given its queued copy). */
#define SUBSCRIPTION_IDS_MAX 64
struct json_message {
	const char *topic;             /* in the JSON */
	unsigned char *payload;        /* the caller frees it */
	size_t len;
	int qos;
	mosquitto_property *props;     /* the caller frees or hands them on */
};
int message_from_json(const cJSON *item, struct json_message *m);
/* The Subscription Identifiers in a property list as a JSON array, NULL if none. */
cJSON *subscription_ids_to_json(const mosquitto_property *props);
/* Append the Subscription Identifiers of `from` to `to`. 0 on success. */
int subscription_ids_copy(const mosquitto_property *from, mosquitto_property **to);

#endif
