/* MQFB batches: records of messages crossing nodes (docs/plugin-protocol.md, "Batches").
 * A bounded parser: every length is checked against the bytes left before use. */
#ifndef MQFED_BATCH_H
#define MQFED_BATCH_H

#include "util.h"

#define MQFB_HEADER_LEN 16u          /* "MQFB", version, flags, u16 count, u64 batch */
#define MQFB_VERSION 1u
#define MQFB_KIND_MESSAGE 1u
#define MQFB_KIND_CUT 2u                 /* a session's cut: client, origin, seq, generation */
#define MQFB_KIND_BARRIER 4u             /* capture socket: a barrier probe, its token the payload */
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

/* ---- encoding (capture.c: records the plugin sends to its sidecar) ---------------------- */

#define MQFB_REC_FIXED 34u           /* u32 length + what a record has besides its fields */
#define MQFH_LEN 24u                 /* "MQFH" u8 version u8 0 u16 0 u64 epoch u64 next_seq */
#define MQFA_HEADER_LEN 16u          /* ack: "MQFA" u8 version u8 kind u16 count u64 seq */
#define MQFA_KIND_RESUME 1u
#define MQFA_KIND_ACK 2u

/* The batch header for `count` records, its id `id`, into out[MQFB_HEADER_LEN]. */
void mqfb_put_header(uint8_t *out, uint16_t count, uint64_t id);
/* The hello the plugin writes first on each connection of the capture socket. */
void mqfh_put(uint8_t *out, uint64_t epoch, uint64_t next_seq);
/* The MQTT v5 encoding of the properties a record carries (payload format, content type,
 * response topic, correlation data, user properties, in list order; anything else is left
 * out). *out is malloc'd (NULL, *len 0 when there are none); false when out of memory or
 * longer than 1 MiB. */
bool mqfb_encode_props(const mosquitto_property *props, uint8_t **out, uint32_t *len);
/* Bytes of the encoded record at `rec` (its u32 length prefix included). */
size_t mqfb_encoded_size(const uint8_t *rec);
/* Bytes of an encoded record (its u32 length included). */
size_t mqfb_record_size(size_t topic_len, size_t client_len, uint32_t props_len,
		uint32_t payload_len);
/* Encode one record of `kind` into `out` (mqfb_record_size bytes). */
void mqfb_put_record(uint8_t *out, uint8_t kind, uint8_t qos, bool retain, uint64_t seq, uint64_t hlc,
		const char *topic, size_t topic_len, const char *client, size_t client_len,
		const uint8_t *props, uint32_t props_len, const void *payload, uint32_t payload_len);

/* Encode one message record naming its origin node (flag 0x08) into `out`
 * (mqfb_record_size + 2 + origin_len bytes). */
void mqfb_put_origin_record(uint8_t *out, uint8_t qos, bool retain, uint64_t seq,
		uint64_t hlc, const char *topic, size_t topic_len, const char *client, size_t client_len,
		const char *origin, size_t origin_len, const uint8_t *props, uint32_t props_len,
		const void *payload, uint32_t payload_len);

/* One message from the sidecar on the capture socket. */
struct mqfa_msg {
	uint8_t kind;                    /* MQFA_KIND_RESUME or MQFA_KIND_ACK */
	uint16_t count;                  /* settled seqs listed above `seq` */
	uint64_t seq;                    /* every record <= seq is settled */
	const uint8_t *listed;           /* count little-endian u64s */
};

/* Parse the message at the start of buf[0..len): 1 with *used its bytes, 0 when more bytes
 * are needed, -1 when malformed (*why says what). Only the framing is checked here. */
int mqfa_parse(const uint8_t *buf, size_t len, struct mqfa_msg *m, size_t *used,
		const char **why);
uint64_t mqfa_listed(const struct mqfa_msg *m, uint16_t i);

#endif
