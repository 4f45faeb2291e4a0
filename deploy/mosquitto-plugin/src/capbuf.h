/* The capture buffer (capbuf.c): records held until the sidecar acknowledges them, and the
 * unix socket they go through. */
#ifndef MQFED_CAPBUF_H
#define MQFED_CAPBUF_H

#include "util.h"

struct capbuf_stats {
	bool connected;            /* the socket is connected and the sidecar sent its resume */
	uint64_t next_seq;         /* the seq the next record gets */
	uint64_t records;          /* records made */
	uint64_t buffered;         /* records not acknowledged yet */
	uint64_t buffered_bytes;   /* their bytes */
	uint64_t acked;            /* records acknowledged */
	uint64_t connects;         /* connections made to the socket */
	uint64_t malformed;        /* messages from the sidecar refused (connection closed) */
	uint64_t sent_bytes;       /* bytes written to the socket */
};

int capbuf_init(const char *path, uint64_t epoch);
bool capbuf_append(uint8_t kind, uint8_t qos, bool retain, const char *topic, size_t topic_len,
		const char *client, size_t client_len, const uint8_t *props, uint32_t props_len,
		const void *payload, uint32_t payload_len);
uint64_t capbuf_bytes(void);
void capbuf_attach(int fd);
void capbuf_feed(const uint8_t *buf, size_t len);
void capbuf_tick(void);
void capbuf_stats(struct capbuf_stats *s);
void capbuf_cleanup(void);

#endif
