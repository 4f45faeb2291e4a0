/* The hold list: offline sessions that queue nothing, and replicas' rings (hold.c). */
#ifndef MQFED_HOLD_H
#define MQFED_HOLD_H

#include "util.h"

/* the cut marker: payload "cut:<id>", a new copy's followed by NUL and its client's connect
 * time here (wall clock ms, decimal): a peer applies that cut only to a copy the client used
 * before it (cut.c) */
#define CUT_PROBE_TOPIC "$SYS/broker/mqfed/fwd-probe"

int hold_set(const char *id, bool ring, bool live, bool cut);
void hold_on_connect(const char *id);
int hold_release_skipping(const char *id, const cJSON *granted, const cJSON *cuts);
int hold_chain_skips(const char *id, const cJSON *granted, const cJSON *cuts);
void hold_release(const char *id, bool replay, int64_t since_ms);
bool hold_refuses(const char *id, bool shared_check, bool online, const char *topic,
		const void *payload, uint32_t len, uint8_t qos);
void hold_connected(const char *id);
void hold_tick(void);
/* `waited`: ticks a replay waited for, a batch injected before it; `flushed`: replays done at
 * once, their client having moved on (see hold.c). */
void hold_stats(uint64_t *held, uint64_t *ring_messages, uint64_t *ring_bytes,
		uint64_t *replayed, uint64_t *waited, uint64_t *flushed, uint64_t *chained);
void hold_clear(void);

#endif
