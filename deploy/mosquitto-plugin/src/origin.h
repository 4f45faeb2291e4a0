/* Re-injected messages never reach shared subscriptions (origin.c). */
#ifndef MQFED_ORIGIN_H
#define MQFED_ORIGIN_H

#include "util.h"

struct origin_stats {
	uint64_t denied;           /* deliveries to shared subscriptions refused */
	unsigned tracked;          /* QoS 2 messages awaiting their PUBREL */
	uint64_t forgotten;        /* entries forgotten before their routing */
	uint64_t no_local;         /* injected messages kept from their publisher's No Local subs */
};

void origin_init(uint64_t q2_max, uint64_t hash_seed);
void origin_event(void);
uint64_t origin_run_seq(void);
void origin_on_message(const struct mosquitto_evt_message *ed);
bool origin_shared_check(struct mosquitto *client, const char *topic);
void origin_keep_props(bool on);
const mosquitto_property *origin_routed_props(const char *topic, const void *payload,
		uint32_t len, uint8_t qos);
bool origin_read_denied(struct mosquitto *client, const char *topic, const void *payload,
		uint32_t payloadlen, uint8_t qos, bool retain, bool shared_check);
void origin_fwd_auth(struct mosquitto *client);
void origin_fwd_disconnect(struct mosquitto *client);
void origin_tick(void);
/* Who an injected message is (its batch record): No Local, and a moving session's cuts. */
struct injected_id {
	const char *publisher;     /* its publisher's client id (not NUL-terminated); may be empty */
	uint16_t publisher_len;
	const char *origin;        /* the node it was published on; may be empty */
	uint16_t origin_len;
	uint64_t seq;              /* its seq there */
};

void origin_injected(const char *topic, const void *payload, uint32_t payloadlen, uint8_t qos,
		const mosquitto_property *props, const struct injected_id *id);
bool origin_read_identity(uint64_t *origin, uint64_t *seq);
bool origin_read_injected(void);
void origin_stats(struct origin_stats *s);
void origin_cleanup(void);

#endif
