/* QoS 2 messages a client acknowledged (PUBREC) but had not seen released (PUBREL) when it
 * left this node, and their release with the same packet identifier on the node where it
 * resumed (inflight.c). */
#ifndef MQFED_INFLIGHT_H
#define MQFED_INFLIGHT_H

#include "util.h"

/* Finds Mosquitto's client fields this module reads (at the sidecar's own connect). */
void inflight_on_sidecar_auth(struct mosquitto *client);
/* A shadow connects: a session it makes here numbers its messages from a random packet id,
 * so that the ids of another node's copy, released here later, are unlikely to be in use. */
void inflight_on_shadow_auth(struct mosquitto *client);
/* Mosquitto's max_queued_messages (plugin_opt_max_queued_messages; 0: unknown). */
void inflight_set_max_queued(long max_queued);
/* Whether Mosquitto queues one more QoS 1/2 message for this offline session: it holds fewer
 * than max_queued_messages (db__ready_for_queue; nothing is in flight offline), or that is not
 * known. Counts the ones it drops (stats `offline_queue_full`). */
bool inflight_offline_takes(struct mosquitto *conn);
/* Messages queued for a live client beyond its in-flight window (false: not readable). */
bool inflight_out_queued(struct mosquitto *conn, int *queued);
/* A client (not a shadow) disconnects: keeps a copy of its QoS 2 messages awaiting PUBCOMP. */
void inflight_capture(struct mosquitto *conn, const char *id);
/* The client is back here, or its session ended: Mosquitto itself resolves them, or nobody. */
void inflight_forget(const char *id);
/* Drops those of `id` with these packet ids (a JSON array): the next node has them. */
void inflight_forget_ids(const char *id, const cJSON *mids);
/* [{"mid", "topic", "payload" (base64), "qos", "properties"}] kept for `id` (maybe empty),
 * including those a `release` left for the next tick while it is not connected here. */
cJSON *inflight_unreleased_json(const char *id, bool live_here);
/* Queue these messages for `client` to be sent with their own packet identifiers at the end
 * of this loop iteration; NULL, or the error code. */
const char *inflight_release(const char *client, const cJSON *messages);
/* A targeted QoS > 0 delivery was queued in this loop iteration (it takes a packet id first). */
void inflight_note_targeted(void);
/* The end of a loop iteration: the releases that can go now (`live_conn`: a client's live
 * connection here, or NULL and whether its session is here). A client offline here keeps
 * them (owed) for its next connect here or the next node's drain. */
void inflight_tick(struct mosquitto *(*live_conn)(const char *id, bool *has_session));
/* A READ check of `client`: a PUBCOMP answering a PUBREL of ours gave its send quota one
 * place too many; taken back before Mosquitto routes it a message. */
void inflight_on_read(struct mosquitto *client);
/* A client (not a shadow) connected here: Mosquitto resends its own PUBRELs; the messages
 * owed from another node are released at the tick (all are dropped for a new session). */
void inflight_on_client_connect(const char *id, bool session_present);
void inflight_stats(cJSON *o);
void inflight_cleanup(void);

#endif
