/* Recent publishes for catch-up: what a peer's new subscription missed here (recent.c). */
#ifndef MQFED_RECENT_H
#define MQFED_RECENT_H

#include "util.h"

#define RECENT_MAX_FILTERS 1000    /* filters per catchup command */

struct recent_stats {
	uint64_t entries;          /* publishes held */
	uint64_t bytes;            /* their size, counted against catchup_bytes */
	uint64_t pending;          /* QoS 2 publishes whose routing (PUBREL) has not been seen */
	uint64_t replayed;         /* messages returned by catchup commands */
	uint64_t requests;         /* catchup commands answered */
	uint64_t incomplete;       /* ...whose window reached past what the ring still held */
};

/* One filter of a catchup command: verbatim ($share/<g>/<f> or <f>), and the subscribe time. */
struct recent_query {
	const char *filter;
	int64_t since_ms;
};

void recent_init(uint64_t window_ms, uint64_t max_bytes);
bool recent_enabled(void);
void recent_on_message(const struct mosquitto_evt_message *ed, bool record);
bool recent_read(struct mosquitto *client, const char *topic, const void *payload, uint32_t len,
		uint8_t qos, bool retain);
const mosquitto_property *recent_routed_props(const char *topic, const void *payload,
		uint32_t len, uint8_t qos);
void recent_sidecar_checks(void);
void recent_fwd_filter(const char *filter, bool subscribed);
const char *recent_catchup(const struct recent_query *q, unsigned n, cJSON *reply);
void recent_tick(void);
void recent_stats(struct recent_stats *s);
void recent_cleanup(void);

#endif
