/* `$CONTROL/mqfed/inject`: a batch of messages from peers, re-injected inside Mosquitto
 * (inject.c; docs/plugin-protocol.md, "Batches"). */
#ifndef MQFED_INJECT_H
#define MQFED_INJECT_H

#include "util.h"

#define MQFED_INJECT_TOPIC "$CONTROL/mqfed/inject"
#define MQFED_INJECT_REPLY "$SYS/broker/mqfed/replies/inject"
#define INJECT_MAX_RECORDS 65535u

struct inject_stats {
	uint64_t batches;          /* batches injected */
	uint64_t messages;         /* messages injected */
	uint64_t refused;          /* batches refused (malformed, or not from the sidecar) */
	uint64_t left_out;         /* measures of a slow client left out of `queued` */
	unsigned slow_clients;     /* clients tracked near the bound */
};

/* Mosquitto's max_queued_messages (plugin_opt_max_queued_messages; 0: unknown or unlimited:
 * no client is ever left out of `queued`). */
void inject_set_max_queued(long max_queued);
void inject_on_control(const struct mosquitto_evt_control *ed);
/* A READ check granted `client` (live, not the sidecar's) an injected message: notes its queue. */
void inject_measure(struct mosquitto *client);
/* A client disconnected: it starts again as any other when it is back. */
void inject_forget(const char *id);
/* The end of a loop iteration: the replies of the batches routed in it. */
/* Whether a batch's message went into Mosquitto's plugin queue since the last call: it is
 * routed at the top of the next iteration, ahead of what the plugin publishes after it
 * (hold.c waits a tick with its replays). */
bool inject_take_queued(void);
void inject_tick(void);
void inject_stats(struct inject_stats *s);
void inject_cleanup(void);

#endif
