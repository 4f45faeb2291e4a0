/* MQFB batches: records of messages crossing nodes (docs/plugin-protocol.md, "Batches").
 * A bounded parser: every length is checked against the bytes left before use. */
#ifndef MQFED_BATCH_H
#define MQFED_BATCH_H

#include "util.h"

#define MQFB_HEADER_LEN 16u          /* "MQFB", version, flags, u16 count, u64 batch */
#define MQFB_VERSION 1u
#define MQFB_KIND_MESSAGE 1u
#define MQFB_KIND_CUT 2u                 /* a session's cut: client, origin, seq, generation */
#define MQFB_FLAG_ORIGIN 0x08u           /* record flag: the origin node's id follows the client */

struct mqfb_batch {
	uint64_t id;                     /* the sender's batch number: the reply names it */
	uint16_t count;
	const uint8_t *next;             /* the records not parsed yet */
	size_t left;
};

struct mqfb_record {
	uint8_t kind;
	uint8_t qos;
	bool retain;
	uint64_t seq;
	uint64_t hlc;
	const char *topic;               /* not NUL-terminated */
	uint16_t topic_len;
	const char *client;              /* the publisher's client id; may be empty */
	uint16_t client_len;
	const char *origin;              /* the node it was published on (flag 0x08); may be empty */
	uint16_t origin_len;
	const uint8_t *props;            /* MQTT v5 property encoding (big-endian fields) */
	uint32_t props_len;
	const uint8_t *payload;
	uint32_t payload_len;
};

/* 0, or a short reason ("short", "magic", "version", "count"). */
const char *mqfb_open(const uint8_t *buf, size_t len, struct mqfb_batch *b);
/* The next record; NULL on success, else a reason. Records past `count` are an error. */
const char *mqfb_next(struct mqfb_batch *b, struct mqfb_record *r);
/* The record's properties as a list (NULL for none); NULL on success, else a reason. Only
 * those a PUBLISH may carry to a subscriber: payload format, message expiry, content type,
 * response topic, correlation data, user properties. */
const char *mqfb_props(const struct mqfb_record *r, mosquitto_property **out);

#endif
