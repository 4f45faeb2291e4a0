/* Capture (capture.c): client messages the forwarding connection would get, handed to the
 * sidecar as MQFB records over a unix socket instead of MQTT copies. */
#ifndef MQFED_CAPTURE_H
#define MQFED_CAPTURE_H

#include "util.h"

struct capture_stats {
	bool on;
	bool connected;            /* the socket is connected and the sidecar sent its resume */
	uint64_t next_seq;         /* the seq the next record gets */
	uint64_t records;          /* records made */
	uint64_t buffered;         /* records not acknowledged yet */
	uint64_t buffered_bytes;   /* their bytes */
	uint64_t acked;            /* records acknowledged */
	uint64_t dropped;          /* QoS 0 messages dropped past capture_max_bytes */
	uint64_t passed;           /* QoS 1/2 messages left to the MQTT path past capture_max_bytes */
	uint64_t connects;         /* connections made to the socket */
	uint64_t malformed;        /* messages from the sidecar refused (connection closed) */
	uint64_t sent_bytes;       /* bytes written to the socket */
};

int capture_init(const char *path, uint64_t max_bytes, uint64_t epoch);
bool capture_enabled(void);
void capture_fwd_filter(const char *filter, bool subscribed);
void capture_fwd_connected(bool clean_start);
void capture_fwd_disconnected(int64_t expiry);
void capture_on_message(const struct mosquitto_evt_message *ed);
bool capture_read(const char *topic, const void *payload, uint32_t len, uint8_t qos,
		bool *recorded);
bool capture_marker(uint8_t kind, const char *client, const void *token, uint32_t token_len);
void capture_tick(void);
void capture_stats(struct capture_stats *s);
void capture_cleanup(void);

#endif
