/* The plugin's model of clients, sessions and subscriptions (model.c). */
#ifndef MQFED_MODEL_H
#define MQFED_MODEL_H

#include "util.h"

/* One client id known to the plugin: an online connection or an offline persistent session.
 * Owned by model.c; valid until the next change of the model. */
struct client;

/* Kept with each client for origin.c: the READ checks Mosquitto makes for this client while
 * routing one re-injected message. */
struct client_run {
	uint64_t seq;              /* which routing */
	const char *topic;         /* identity only, never dereferenced */
	unsigned checks;           /* checks so far */
	unsigned plain;            /* matching plain subscriptions */
	unsigned shared;           /* matching shared subscriptions */
};

void model_cleanup(void);
void model_set_connect_listener(void (*fn)(const char *id));
struct client *model_find(const char *id);
struct client *model_next(struct client *c);
unsigned model_sessions(void);
unsigned model_online(void);
uint64_t model_subscriptions(void);
uint64_t model_shared_subscriptions(void); /* $share/... ones, over every client */
const char *model_client_id(const struct client *c);
bool model_client_online(const struct client *c);
/* When the client itself last connected here (wall clock ms; a shadow's connect is not one):
 * 0 if it has not since its session was made here. */
int64_t model_client_connect_ms(const struct client *c);
struct mosquitto *model_client_conn(const struct client *c);
bool model_client_has_sub(struct client *c, const char *filter);
/* The granted QoS of the client's subscription `filter` (-1: none). */
int model_sub_qos(struct client *c, const char *filter);
/* The subscription identifier Mosquitto holds for the client's `filter` (0: none, unknown). */
uint32_t model_sub_identifier(struct client *c, const char *filter);
void model_sub_options(struct client *c, const char *filter, uint8_t options, uint32_t sub_id);
unsigned model_client_shared(const struct client *c);
void model_count_matches(struct client *c, const char *topic, unsigned *plain, unsigned *shared);
#define SUBOPT_NO_LOCAL 0x04u /* in a subscription's options (model_sub_options) */
bool model_plain_matches_all_no_local(struct client *c, const char *topic);
bool model_single_plain_match(struct client *c, const char *topic, uint8_t *qos,
		uint32_t *sub_id);
struct client_run *model_client_run(struct client *c);
cJSON *model_client_json(struct client *c);
unsigned model_client_subs(const struct client *c);
cJSON *model_client_json_part(struct client *c, void **from, unsigned max);
/* Messages Mosquitto routed to an offline session (granted READ checks at QoS > 0) since its
 * client or a shadow was last connected: what it queues, unless its queue limit dropped some. */
void model_note_queued(const char *id);
/* {id: queued} for the offline sessions among `ids` (a JSON array), or for every offline
 * session with queued messages when `ids` is not an array; at most `max` entries. */
cJSON *model_queued_json(const cJSON *ids, unsigned max);
/* The sum over every offline session. */
uint64_t model_queued_total(void);

void pending_add(struct mosquitto *conn, const char *id, const char *username);
void pending_resolve_conn(struct mosquitto *conn);
void pending_resolve_all(void);
struct client *model_client_for_event(struct mosquitto *conn, bool adopt);
/* `conn` is the live connection of its client id (not an offline session's old context). */
bool model_is_live(struct mosquitto *conn);
void model_on_disconnect(struct mosquitto *conn);
void model_subscribe(struct client *c, const char *filter, uint8_t qos);
void model_unsubscribe(struct client *c, const char *filter);
void model_expire_sessions(time_t now);
void model_fill_unknown_expiry(void);
void emit_connect_rejected(const char *id, const char *username, const char *reason);

void model_kick(struct mosquitto *conn, const char *id, bool with_will);
bool model_is_kicking(struct mosquitto *conn);

#endif
