/* MQFB batch parsing (batch.h). Layout, little-endian:
 *   batch  = "MQFB" u8 version u8 flags u16 count u64 batch-id, then `count` records
 *   record = u32 length (of what follows) u8 kind u8 flags (qos bits 0-1, retain bit 2)
 *            u64 seq u64 hlc u16 topic_len topic u16 client_len client
 *            [u16 origin_len origin, with flag bit 3] u32 props_len props u32 payload_len payload
 * A record's fields must fill its length exactly. */
#include <string.h>

#include "batch.h"

#define REC_FIXED 30u                /* kind, flags, seq, hlc, three lengths before payload_len */

static uint16_t le16(const uint8_t *p)
{
	return (uint16_t)(p[0] | p[1] << 8);
}

static uint32_t le32(const uint8_t *p)
{
	return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static uint64_t le64(const uint8_t *p)
{
	return (uint64_t)le32(p) | (uint64_t)le32(p + 4) << 32;
}

const char *mqfb_open(const uint8_t *buf, size_t len, struct mqfb_batch *b)
{
	memset(b, 0, sizeof(*b));
	if(buf == NULL || len < MQFB_HEADER_LEN) return "short";
	if(memcmp(buf, "MQFB", 4) != 0) return "magic";
	if(buf[4] != MQFB_VERSION) return "version";
	b->count = le16(buf + 6);
	b->id = le64(buf + 8);
	b->next = buf + MQFB_HEADER_LEN;
	b->left = len - MQFB_HEADER_LEN;
	return NULL;
}

/* A field of `n` bytes from a record's remaining bytes. */
static const uint8_t *take(const uint8_t **p, uint32_t *left, uint32_t n)
{
	const uint8_t *at = *p;

	if(n > *left) return NULL;
	*p += n;
	*left -= n;
	return at;
}

const char *mqfb_next(struct mqfb_batch *b, struct mqfb_record *r)
{
	const uint8_t *p, *f;
	uint32_t len, left;
	uint8_t flags;

	memset(r, 0, sizeof(*r));
	if(b->count == 0) return b->left ? "trailing" : "count";
	if(b->left < 4) return "short";
	len = le32(b->next);
	if(len > b->left - 4) return "length";
	p = b->next + 4;
	left = len;
	if(left < REC_FIXED) return "short";
	r->kind = p[0];
	flags = p[1];
	r->qos = p[1] & 3;
	r->retain = (p[1] & 4) != 0;
	if(p[1] & ~(7u | MQFB_FLAG_ORIGIN)) return "flags";
	if(r->qos > 2) return "qos";
	r->seq = le64(p + 2);
	r->hlc = le64(p + 10);
	p += 18;
	left -= 18;
	r->topic_len = le16(p);
	p += 2;
	left -= 2;
	if((f = take(&p, &left, r->topic_len)) == NULL) return "topic";
	r->topic = (const char *)f;
	if(left < 2) return "short";
	r->client_len = le16(p);
	p += 2;
	left -= 2;
	if((f = take(&p, &left, r->client_len)) == NULL) return "client";
	r->client = (const char *)f;
	if(flags & MQFB_FLAG_ORIGIN){
		if(left < 2) return "short";
		r->origin_len = le16(p);
		p += 2;
		left -= 2;
		if((f = take(&p, &left, r->origin_len)) == NULL) return "origin";
		r->origin = (const char *)f;
	}
	if(left < 4) return "short";
	r->props_len = le32(p);
	p += 4;
	left -= 4;
	if((f = take(&p, &left, r->props_len)) == NULL) return "properties";
	r->props = f;
	if(left < 4) return "short";
	r->payload_len = le32(p);
	p += 4;
	left -= 4;
	if((f = take(&p, &left, r->payload_len)) == NULL) return "payload";
	r->payload = f;
	if(left != 0) return "length";
	b->next += 4 + (size_t)len;
	b->left -= 4 + (size_t)len;
	b->count--;
	return NULL;
}

static uint16_t be16(const uint8_t *p)
{
	return (uint16_t)(p[0] << 8 | p[1]);
}

/* An MQTT string or binary field: u16 big-endian length, then that many bytes. */
static const uint8_t *field(const uint8_t **p, uint32_t *left, uint16_t *n)
{
	if(*left < 2) return NULL;
	*n = be16(*p);
	*p += 2;
	*left -= 2;
	return take(p, left, *n);
}

/* A NUL-terminated copy of a UTF-8 string field (MQTT rules: no NUL, valid UTF-8). */
static char *utf8_copy(const uint8_t *s, uint16_t n)
{
	char *c;

	if(memchr(s, 0, n) != NULL) return NULL;
	if(mosquitto_validate_utf8((const char *)s, n) != MOSQ_ERR_SUCCESS) return NULL;
	c = malloc((size_t)n + 1);
	if(c == NULL) return NULL;
	memcpy(c, s, n);
	c[n] = '\0';
	return c;
}

static const char *one_prop(const uint8_t **p, uint32_t *left, mosquitto_property **out,
		uint64_t *seen)
{
	uint8_t id;
	const uint8_t *a, *b;
	uint16_t an, bn;
	char *s1 = NULL, *s2 = NULL;
	int rc = MOSQ_ERR_SUCCESS;
	const char *bad = "property";

	if((a = take(p, left, 1)) == NULL) return "property";
	id = a[0];
	if(id < 64 && id != MQTT_PROP_USER_PROPERTY){
		if(*seen & (UINT64_C(1) << id)) return "duplicate property"; /* MQTT: at most once */
		*seen |= UINT64_C(1) << id;
	}
	switch(id){
		case MQTT_PROP_PAYLOAD_FORMAT_INDICATOR:
			if((a = take(p, left, 1)) == NULL || a[0] > 1) return "property";
			rc = mosquitto_property_add_byte(out, id, a[0]);
			break;
		case MQTT_PROP_MESSAGE_EXPIRY_INTERVAL:
			if((a = take(p, left, 4)) == NULL) return "property";
			rc = mosquitto_property_add_int32(out, id,
					(uint32_t)a[0] << 24 | (uint32_t)a[1] << 16 | (uint32_t)a[2] << 8 | a[3]);
			break;
		case MQTT_PROP_CONTENT_TYPE:
		case MQTT_PROP_RESPONSE_TOPIC:
			if((a = field(p, left, &an)) == NULL || (s1 = utf8_copy(a, an)) == NULL) break;
			if(id == MQTT_PROP_RESPONSE_TOPIC && mosquitto_pub_topic_check(s1) != MOSQ_ERR_SUCCESS){
				break;
			}
			bad = NULL;
			rc = mosquitto_property_add_string(out, id, s1);
			break;
		case MQTT_PROP_CORRELATION_DATA:
			if((a = field(p, left, &an)) == NULL) return "property";
			rc = mosquitto_property_add_binary(out, id, a, an);
			break;
		case MQTT_PROP_USER_PROPERTY:
			if((a = field(p, left, &an)) == NULL || (b = field(p, left, &bn)) == NULL) break;
			if((s1 = utf8_copy(a, an)) == NULL || (s2 = utf8_copy(b, bn)) == NULL) break;
			bad = NULL;
			rc = mosquitto_property_add_string_pair(out, id, s1, s2);
			break;
		default:
			return "property";
	}
	if(id == MQTT_PROP_CONTENT_TYPE || id == MQTT_PROP_RESPONSE_TOPIC
			|| id == MQTT_PROP_USER_PROPERTY){
		free(s1);
		free(s2);
		if(bad) return bad;
	}
	return rc == MOSQ_ERR_SUCCESS ? NULL : "memory";
}

const char *mqfb_props(const struct mqfb_record *r, mosquitto_property **out)
{
	const uint8_t *p = r->props;
	uint32_t left = r->props_len;
	const char *why;
	uint64_t seen = 0;

	*out = NULL;
	while(left > 0){
		why = one_prop(&p, &left, out, &seen);
		if(why){
			mosquitto_property_free_all(out);
			return why;
		}
	}
	return NULL;
}

/* ---- encoding ---------------------------------------------------------------------------- */

static void put16(uint8_t *p, uint16_t v)
{
	p[0] = (uint8_t)v;
	p[1] = (uint8_t)(v >> 8);
}

static void put32(uint8_t *p, uint32_t v)
{
	put16(p, (uint16_t)v);
	put16(p + 2, (uint16_t)(v >> 16));
}

static void put64(uint8_t *p, uint64_t v)
{
	put32(p, (uint32_t)v);
	put32(p + 4, (uint32_t)(v >> 32));
}

void mqfb_put_header(uint8_t *out, uint16_t count, uint64_t id)
{
	memcpy(out, "MQFB", 4);
	out[4] = MQFB_VERSION;
	out[5] = 0;
	put16(out + 6, count);
	put64(out + 8, id);
}

void mqfh_put(uint8_t *out, uint64_t epoch, uint64_t next_seq)
{
	memcpy(out, "MQFH", 4);
	out[4] = 1;
	out[5] = 0;
	put16(out + 6, 0);
	put64(out + 8, epoch);
	put64(out + 16, next_seq);
}

size_t mqfb_encoded_size(const uint8_t *rec)
{
	return 4 + (size_t)le32(rec);
}

size_t mqfb_record_size(size_t topic_len, size_t client_len, uint32_t props_len,
		uint32_t payload_len)
{
	return MQFB_REC_FIXED + topic_len + client_len + (size_t)props_len + payload_len;
}

static void put_record(uint8_t *out, size_t size, uint8_t kind, uint8_t qos, bool retain,
		uint64_t seq, uint64_t hlc, const char *topic, size_t topic_len, const char *client,
		size_t client_len, const char *origin, size_t origin_len, const uint8_t *props,
		uint32_t props_len, const void *payload, uint32_t payload_len)
{
	put32(out, (uint32_t)(size - 4));
	out[4] = kind;
	out[5] = (uint8_t)((qos & 3) | (retain ? 4 : 0) | (origin ? MQFB_FLAG_ORIGIN : 0));
	put64(out + 6, seq);
	put64(out + 14, hlc);
	out += 22;
	put16(out, (uint16_t)topic_len);
	memcpy(out + 2, topic, topic_len);
	out += 2 + topic_len;
	put16(out, (uint16_t)client_len);
	if(client_len) memcpy(out + 2, client, client_len);
	out += 2 + client_len;
	if(origin){
		put16(out, (uint16_t)origin_len);
		if(origin_len) memcpy(out + 2, origin, origin_len);
		out += 2 + origin_len;
	}
	put32(out, props_len);
	if(props_len) memcpy(out + 4, props, props_len);
	out += 4 + props_len;
	put32(out, payload_len);
	if(payload_len) memcpy(out + 4, payload, payload_len);
}

void mqfb_put_record(uint8_t *out, uint8_t kind, uint8_t qos, bool retain, uint64_t seq,
		uint64_t hlc, const char *topic, size_t topic_len, const char *client, size_t client_len,
		const uint8_t *props, uint32_t props_len, const void *payload, uint32_t payload_len)
{
	put_record(out, mqfb_record_size(topic_len, client_len, props_len, payload_len), kind, qos,
			retain, seq, hlc, topic, topic_len, client, client_len, NULL, 0, props, props_len,
			payload, payload_len);
}

void mqfb_put_origin_record(uint8_t *out, uint8_t qos, bool retain, uint64_t seq,
		uint64_t hlc, const char *topic, size_t topic_len, const char *client, size_t client_len,
		const char *origin, size_t origin_len, const uint8_t *props, uint32_t props_len,
		const void *payload, uint32_t payload_len)
{
	put_record(out, mqfb_record_size(topic_len, client_len, props_len, payload_len) + 2
			+ origin_len, MQFB_KIND_MESSAGE, qos, retain, seq, hlc, topic, topic_len, client,
			client_len, origin, origin_len, props, props_len, payload, payload_len);
}

/* A growing byte string for mqfb_encode_props. */
struct bytes {
	uint8_t *p;
	size_t n, cap;
	bool failed;
};

#define PROPS_MAX (1u << 20)

static void add(struct bytes *b, const void *data, size_t len)
{
	uint8_t *grown;
	size_t cap;

	if(b->failed) return;
	if(b->n + len > PROPS_MAX){
		b->failed = true;
		return;
	}
	if(b->n + len > b->cap){
		cap = (b->n + len) * 2 + 64;
		grown = realloc(b->p, cap);
		if(grown == NULL){
			b->failed = true;
			return;
		}
		b->p = grown;
		b->cap = cap;
	}
	memcpy(b->p + b->n, data, len);
	b->n += len;
}

static void add_byte(struct bytes *b, uint8_t v)
{
	add(b, &v, 1);
}

/* An MQTT string or binary field: big-endian u16 length, then the bytes. */
static void add_field(struct bytes *b, const void *data, size_t len)
{
	uint8_t n[2] = {(uint8_t)(len >> 8), (uint8_t)len};

	if(len > UINT16_MAX){
		b->failed = true;
		return;
	}
	add(b, n, 2);
	add(b, data, len);
}

bool mqfb_encode_props(const mosquitto_property *props, uint8_t **out, uint32_t *len)
{
	struct bytes b = {NULL, 0, 0, false};
	const mosquitto_property *p;
	char *k, *s;
	void *bin;
	uint16_t blen;
	uint8_t byte;

	*out = NULL;
	*len = 0;
	for(p = props; p && !b.failed; p = mosquitto_property_next(p)){
		int id = mosquitto_property_identifier(p);

		k = s = NULL;
		bin = NULL;
		switch(id){
			case MQTT_PROP_PAYLOAD_FORMAT_INDICATOR:
				if(mosquitto_property_read_byte(p, id, &byte, false)){
					add_byte(&b, (uint8_t)id);
					add_byte(&b, byte);
				}
				break;
			case MQTT_PROP_CONTENT_TYPE:
			case MQTT_PROP_RESPONSE_TOPIC:
				if(mosquitto_property_read_string(p, id, &s, false)){
					add_byte(&b, (uint8_t)id);
					add_field(&b, s, strlen(s));
				}
				break;
			case MQTT_PROP_CORRELATION_DATA:
				if(mosquitto_property_read_binary(p, id, &bin, &blen, false)){
					add_byte(&b, (uint8_t)id);
					add_field(&b, bin, blen);
				}
				break;
			case MQTT_PROP_USER_PROPERTY:
				if(mosquitto_property_read_string_pair(p, id, &k, &s, false)){
					add_byte(&b, (uint8_t)id);
					add_field(&b, k, strlen(k));
					add_field(&b, s, strlen(s));
				}
				break;
			default:
				break; /* not a message's (Mosquitto keeps only these with a message) */
		}
		mosquitto_free(k);
		mosquitto_free(s);
		mosquitto_free(bin);
	}
	if(b.failed){
		free(b.p);
		return false;
	}
	*out = b.p;
	*len = (uint32_t)b.n;
	return true;
}

/* ---- the sidecar's acknowledgements on the capture socket -------------------------------- */

int mqfa_parse(const uint8_t *buf, size_t len, struct mqfa_msg *m, size_t *used,
		const char **why)
{
	size_t need;

	memset(m, 0, sizeof(*m));
	*used = 0;
	*why = NULL;
	/* the magic is checked as soon as its bytes are in: garbage is refused early */
	if(len > 0 && memcmp(buf, "MQFA", len < 4 ? len : 4) != 0){
		*why = "magic";
		return -1;
	}
	if(len >= 5 && buf[4] != 1){
		*why = "version";
		return -1;
	}
	if(len >= 6 && buf[5] != MQFA_KIND_RESUME && buf[5] != MQFA_KIND_ACK){
		*why = "kind";
		return -1;
	}
	if(len < MQFA_HEADER_LEN) return 0;
	m->kind = buf[5];
	m->count = le16(buf + 6);
	m->seq = le64(buf + 8);
	need = MQFA_HEADER_LEN + 8 * (size_t)m->count;
	if(len < need) return 0;
	m->listed = buf + MQFA_HEADER_LEN;
	*used = need;
	return 1;
}

uint64_t mqfa_listed(const struct mqfa_msg *m, uint16_t i)
{
	return i < m->count ? le64(m->listed + 8 * (size_t)i) : 0;
}
