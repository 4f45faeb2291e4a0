/* Seed programs for the fuzz driver: the sidecar connecting and sending every command of the
 * protocol (docs/plugin-protocol.md) with valid and edge-case fields, clients subscribing,
 * publishing and claiming reserved identities and topics. Mutations start from these. */
#include <stdlib.h>
#include <string.h>

#include "seeds.h"
#include "target.h"

struct writer {
	uint8_t *p;
	size_t n, cap;
};

static void put(struct writer *w, const void *data, size_t len)
{
	if(w->n + len > w->cap){
		w->cap = (w->n + len) * 2 + 64;
		w->p = realloc(w->p, w->cap);
		if(w->p == NULL) abort();
	}
	memcpy(w->p + w->n, data, len);
	w->n += len;
}

static void u8(struct writer *w, uint8_t v)
{
	put(w, &v, 1);
}

static void str(struct writer *w, const char *s)
{
	size_t len = strlen(s);

	u8(w, (uint8_t)(len >> 8));
	u8(w, (uint8_t)len);
	put(w, s, len);
}

static void u32(struct writer *w, uint32_t v)
{
	u8(w, (uint8_t)(v >> 24));
	u8(w, (uint8_t)(v >> 16));
	u8(w, (uint8_t)(v >> 8));
	u8(w, (uint8_t)v);
}

/* connect slot k: id pick (see IDS in target.c), flags (bit 0 sidecar username, bit 2 the
 * secret, bits 4-6 the address, bit 7 a TLS identity listener) */
static void connect_(struct writer *w, uint8_t slot, uint8_t pick, uint8_t flags, const char *own,
		uint32_t expiry)
{
	u8(w, OP_CONNECT);
	u8(w, slot);
	u8(w, pick);
	u8(w, flags);
	str(w, own);
	str(w, "user");
	str(w, "pass");
	u32(w, expiry);
}

static void control(struct writer *w, uint8_t slot, const char *json)
{
	u8(w, OP_CONTROL);
	u8(w, slot);
	str(w, json);
}

static void acl(struct writer *w, uint8_t slot, uint8_t access, const char *topic)
{
	u8(w, OP_ACL);
	u8(w, slot);
	u8(w, access);
	u8(w, 9);
	str(w, topic);
	str(w, "payload");
}

static void message(struct writer *w, uint8_t slot, uint8_t bits, const char *topic,
		const char *payload)
{
	u8(w, OP_MESSAGE);
	u8(w, slot);
	u8(w, bits);
	str(w, topic);
	str(w, payload);
	u8(w, 3); /* properties */
	u8(w, 0);
	str(w, "key");
	str(w, "value");
	u8(w, 3);
	str(w, "corr");
	str(w, "");
	u8(w, 2);
	str(w, "reply/to");
	str(w, "");
}

static void le(struct writer *w, uint64_t v, int bytes)
{
	int i;

	for(i = 0; i < bytes; i++) u8(w, (uint8_t)(v >> (8 * i)));
}

/* One MQFB record (batch.c): a message with a publisher id and, if `props`, properties. */
static void record(struct writer *w, uint8_t flags, const char *topic, const char *payload,
		int props)
{
	static const uint8_t PROPS[] = {
		0x01, 1, 0x02, 0, 0, 0, 60, 0x03, 0, 1, 'c', 0x08, 0, 3, 'r', '/', '1',
		0x09, 0, 2, 0, 'x', 0x26, 0, 1, 'k', 0, 1, 'v',
	};
	size_t t = strlen(topic), p = strlen(payload), n = props ? sizeof(PROPS) : 0;

	le(w, 18 + 2 + t + 2 + 2 + 4 + n + 4 + p, 4);
	u8(w, 1);
	u8(w, flags);
	le(w, 7, 8);
	le(w, 9, 8);
	le(w, t, 2);
	put(w, topic, t);
	le(w, 2, 2);
	put(w, "c1", 2);
	le(w, n, 4);
	put(w, PROPS, n);
	le(w, p, 4);
	put(w, payload, p);
}

/* Inject a batch of three records (or a truncated copy), then route them: the TICK, then READ
 * checks with the topic and payload the acl() seeds use (an injected message's identity). */
static void inject(struct writer *w, uint8_t slot, int truncate)
{
	struct writer b = {0};

	put(&b, "MQFB\x01\x00", 6);
	le(&b, 3, 2);
	le(&b, 42, 8);
	record(&b, 0, "a/b", "payload", 1);
	record(&b, 1 | 4, "a/c", "", 0);
	record(&b, 2, "a/b", "payload", 0);
	u8(w, OP_INJECT);
	u8(w, slot);
	u8(w, (uint8_t)((b.n - (size_t)truncate) >> 8));
	u8(w, (uint8_t)(b.n - (size_t)truncate));
	put(w, b.p, b.n - (size_t)truncate);
	free(b.p);
}

/* Bytes the sidecar sends on the capture socket: an MQFA message (resume or ack) with
 * `count` listed seqs, or (bad != 0) a damaged copy of it. */
static void capture_ack(struct writer *w, uint8_t kind, uint64_t seq, uint16_t count,
		uint64_t first_listed, int bad)
{
	struct writer b = {0};
	uint16_t i;

	put(&b, "MQFA\x01", 5);
	u8(&b, kind);
	le(&b, count, 2);
	le(&b, seq, 8);
	for(i = 0; i < count; i++) le(&b, first_listed + i, 8);
	if(bad == 1) b.p[0] = 'X';
	if(bad == 2) b.n -= 3;
	u8(w, OP_CAPTURE);
	u8(w, (uint8_t)(b.n >> 8));
	u8(w, (uint8_t)b.n);
	put(w, b.p, b.n);
	free(b.p);
}

static const char *const COMMANDS[] = {
	"{\"v\":1,\"id\":\"1\",\"reply\":\"$SYS/broker/mqfed/replies/s\",\"cmd\":\"snapshot\"}",
	"{\"v\":1,\"id\":\"2\",\"reply\":\"$SYS/broker/mqfed/replies/s\",\"cmd\":\"resume\",\"from_seq\":1}",
	"{\"v\":1,\"id\":\"3\",\"reply\":\"$SYS/broker/mqfed/replies/s\",\"cmd\":\"resume\",\"from_seq\":9007199254740993,\"epoch\":\"0000000000000000\"}",
	"{\"v\":1,\"cmd\":\"ack\",\"seq\":3}",
	"{\"v\":1,\"cmd\":\"ack\",\"seq\":1e300,\"epoch\":\"x\"}",
	"{\"v\":1,\"id\":\"4\",\"reply\":\"$SYS/broker/mqfed/replies/s\",\"cmd\":\"deliver\",\"client\":\"c1\",\"topic\":\"a/b\",\"payload\":\"aGVsbG8=\",\"qos\":1,\"properties\":{\"user\":[[\"k\",\"v\"]],\"content_type\":\"t\",\"response_topic\":\"r\",\"payload_format\":1,\"message_expiry\":5,\"correlation_data\":\"AAE=\"}}",
	"{\"v\":1,\"id\":\"5\",\"reply\":\"$SYS/broker/mqfed/replies/s\",\"cmd\":\"deliver\",\"client\":\"mqfed-sidecar.fwd\",\"topic\":\"$SYS/broker/mqfed/fwd-probe\",\"payload\":\"\",\"qos\":1}",
	"{\"v\":1,\"id\":\"6\",\"reply\":\"$SYS/broker/mqfed/replies/s\",\"cmd\":\"deliver\",\"client\":\"c2\",\"topic\":\"a/#\",\"payload\":\"=\",\"qos\":3,\"subscription\":\"$share/g/a/#\"}",
	"{\"v\":1,\"id\":\"6b\",\"reply\":\"$SYS/broker/mqfed/replies/s\",\"cmd\":\"deliver_batch\",\"client\":\"c1\",\"messages\":[{\"topic\":\"a/b\",\"payload\":\"aGk=\",\"qos\":1},{\"topic\":\"a/c\",\"payload\":\"\",\"qos\":2,\"properties\":{\"user\":[[\"k\",\"v\"]]}},{\"topic\":\"a/+\",\"payload\":\"x\",\"qos\":1}]}",
	"{\"v\":1,\"id\":\"6c\",\"reply\":\"$SYS/broker/mqfed/replies/s\",\"cmd\":\"queued\",\"clients\":[\"c1\",\"c2\",7]}",
	"{\"v\":1,\"id\":\"6d\",\"reply\":\"$SYS/broker/mqfed/replies/s\",\"cmd\":\"queued\"}",
	"{\"v\":1,\"id\":\"6s\",\"reply\":\"$SYS/broker/mqfed/replies/s\",\"cmd\":\"deliver_batch\",\"client\":\"c1\",\"messages\":[{\"topic\":\"a/b\",\"payload\":\"aGk=\",\"qos\":1,\"subscription_ids\":[1,268435455]},{\"topic\":\"a/c\",\"payload\":\"\",\"qos\":1,\"subscription_ids\":[0]},{\"topic\":\"a/d\",\"payload\":\"\",\"qos\":1,\"subscription_ids\":7}]}",
	"{\"v\":1,\"id\":\"6e\",\"reply\":\"$SYS/broker/mqfed/replies/s\",\"cmd\":\"unreleased\",\"client\":\"c1\"}",
	"{\"v\":1,\"id\":\"6f\",\"reply\":\"$SYS/broker/mqfed/replies/s\",\"cmd\":\"release\",\"client\":\"c1\",\"messages\":[{\"mid\":7,\"topic\":\"a/b\",\"payload\":\"aGk=\",\"qos\":2},{\"mid\":8,\"topic\":\"a/c\",\"payload\":\"\",\"qos\":2,\"properties\":{\"user\":[[\"k\",\"v\"]]}},{\"mid\":0,\"topic\":\"a/+\",\"payload\":\"x\",\"qos\":1}]}",
	"{\"v\":1,\"id\":\"6g\",\"reply\":\"$SYS/broker/mqfed/replies/s\",\"cmd\":\"release\",\"client\":\"c1\",\"messages\":[{\"mid\":65535,\"topic\":\"a/b\",\"payload\":\"aGk=\",\"qos\":2},{\"mid\":1,\"topic\":\"a/b\",\"payload\":\"aGk=\",\"qos\":2}]}",
	"{\"v\":1,\"id\":\"7\",\"reply\":\"$SYS/broker/mqfed/replies/s\",\"cmd\":\"kick\",\"client\":\"c1\",\"with_will\":true}",
	"{\"v\":1,\"id\":\"8\",\"reply\":\"$SYS/broker/mqfed/replies/s\",\"cmd\":\"deny\",\"client\":\"c2\",\"mode\":\"session\"}",
	"{\"v\":1,\"id\":\"9\",\"reply\":\"$SYS/broker/mqfed/replies/s\",\"cmd\":\"admit\",\"client\":\"c2\"}",
	"{\"v\":1,\"id\":\"a\",\"reply\":\"$SYS/broker/mqfed/replies/s\",\"cmd\":\"hold\",\"client\":\"c3\",\"on\":true}",
	"{\"v\":1,\"id\":\"b\",\"reply\":\"$SYS/broker/mqfed/replies/s\",\"cmd\":\"open_sessions\"}",
	"{\"v\":1,\"id\":\"g\",\"reply\":\"$SYS/broker/mqfed/replies/s\",\"cmd\":\"admission\",\"open\":false}",
	"{\"v\":1,\"id\":\"h\",\"reply\":\"$SYS/broker/mqfed/replies/s\",\"cmd\":\"admission\",\"open\":1}",
	"{\"v\":1,\"id\":\"c\",\"reply\":\"$SYS/broker/mqfed/replies/s\",\"cmd\":\"pressure\",\"unacked\":5,\"taken\":2,\"shed_ms\":600000}",
	"{\"v\":1,\"id\":\"d\",\"reply\":\"$SYS/broker/mqfed/replies/s\",\"cmd\":\"stats\"}",
	"{\"v\":1,\"id\":\"l1\",\"reply\":\"$SYS/broker/mqfed/replies/s\",\"cmd\":\"links\",\"node\":\"n1\",\"links\":[{\"peer\":\"n2\",\"host\":\"127.0.0.1\",\"port\":1,\"username\":\"mqfed-link\",\"password\":\"p\"},{\"peer\":\"n3\",\"host\":\"::1\",\"port\":1,\"username\":\"mqfed-link\",\"password\":\"\"}]}",
	"{\"v\":1,\"id\":\"l2\",\"reply\":\"$SYS/broker/mqfed/replies/s\",\"cmd\":\"link_filters\",\"peer\":\"n2\",\"add\":[\"a/#\",\"+/b\",\"#\"],\"remove\":[\"+/b\",\"x\"]}",
	"{\"v\":1,\"id\":\"l3\",\"reply\":\"$SYS/broker/mqfed/replies/s\",\"cmd\":\"links\",\"node\":\"n1\",\"links\":[]}",
	"{\"v\":1,\"id\":\"so\",\"reply\":\"$SYS/broker/mqfed/replies/s\",\"cmd\":\"sub_options\",\"client\":\"c1\",\"subscriptions\":{\"a/b\":4,\"$share/g/a/#\":12,\"z\":300}}",
	"{\"v\":2,\"id\":\"e\",\"reply\":\"$SYS/broker/mqfed/replies/s\",\"cmd\":\"nope\"}",
	"{\"v\":1,\"id\":\"f\",\"reply\":\"elsewhere\",\"cmd\":\"stats\"}",
	"[1,2,{\"v\":1}]",
	"",
};

static const char *const TOPICS[] = {
	"a/b", "a/#", "+/b", "#", "$share/g/a/#", "$share/g", "$mqfed/read-sentinel", "$mqfed/#",
	"$SYS/broker/mqfed/events", "$SYS/#", "$CONTROL/mqfed/v1", "$CONTROL/mqfed/barrier",
	"$share//x", "a//b", "",
};

void seeds_make(struct blob **out, size_t *count)
{
	size_t i, j, n = 0;
	size_t total = sizeof(COMMANDS) / sizeof(COMMANDS[0]) + 4 + 3 + 3;
	struct blob *b = calloc(total, sizeof(*b));

	if(b == NULL) abort();
	for(i = 0; i < sizeof(COMMANDS) / sizeof(COMMANDS[0]); i++){
		struct writer w = {0};
		u8(&w, (uint8_t)(i * 37));
		connect_(&w, 0, 0x80 | 0x40, 0x05, "", 1234567891u); /* the sidecar, v5, calibration */
		connect_(&w, 1, 2, 0x00, "", 3600);                   /* c1 */
		acl(&w, 1, 2, TOPICS[i % 15]);                         /* c1 subscribes */
		control(&w, 0, COMMANDS[i]);
		control(&w, 0, COMMANDS[(i + 5) % (sizeof(COMMANDS) / sizeof(COMMANDS[0]))]);
		u8(&w, OP_TICK);
		b[n++] = (struct blob){w.p, w.n};
	}
	for(j = 0; j < 4; j++){
		struct writer w = {0};
		u8(&w, (uint8_t)(0x21 * j));
		connect_(&w, 0, 0x80 | 0x40, 0x05, "", 1234567891u);
		connect_(&w, 2, 1, 0x05, "", 3600);                   /* .fwd */
		acl(&w, 2, 2, "a/#");
		connect_(&w, 3, 3, 0x20, "", 0);                      /* c2 over TCP */
		connect_(&w, 4, 6, 0x05, "", 60);                     /* a shadow */
		connect_(&w, 5, 0, 0xa0, "", 60);                     /* a TLS identity as the sidecar */
		for(i = 0; i < 15; i++){
			acl(&w, (uint8_t)(3 + i % 3), (uint8_t)i, TOPICS[i]);
			message(&w, (uint8_t)(2 + i % 4), (uint8_t)(0xf8 | i), TOPICS[i], "x");
		}
		acl(&w, 2, 2, "a/+/c");                               /* .fwd's filters, shed */
		acl(&w, 2, 2, "$share/g/x/#");
		acl(&w, 2, 3, "a/+/c");
		control(&w, 0, COMMANDS[13]);                          /* pressure: a lease */
		message(&w, 3, 0xf9, "a/b", "shed me");
		message(&w, 3, 0xfa, "x/y/z", "and me");
		control(&w, 5, COMMANDS[j]);
		u8(&w, OP_DISCONNECT);
		u8(&w, 3);
		u8(&w, 1);
		u8(&w, OP_TICK);
		u8(&w, OP_EXT_AUTH);
		u8(&w, 4);
		b[n++] = (struct blob){w.p, w.n};
	}
	for(j = 0; j < 3; j++){ /* batches injected: whole, cut short, from a client */
		struct writer w = {0};
		u8(&w, (uint8_t)(0x15 * j));
		connect_(&w, 0, 0x80 | 0x40, 0x05, "", 1234567891u);
		connect_(&w, 1, 2, 0x00, "", 3600);                   /* c1 */
		connect_(&w, 2, 1, 0x05, "", 3600);                   /* .fwd */
		acl(&w, 1, 2, "a/#");
		acl(&w, 2, 2, "a/#");
		acl(&w, 2, 2, "$share/g/a/#");
		inject(&w, j == 2 ? 1 : 0, j == 1 ? 5 : 0);
		u8(&w, OP_TICK);
		acl(&w, 1, 0, "a/b");                                  /* READ checks of the routing */
		acl(&w, 2, 0, "a/b");
		acl(&w, 1, 0, "a/b");
		message(&w, 1, 0xf8, "a/b", "payload");                /* ends the routing */
		acl(&w, 2, 0, "a/b");
		b[n++] = (struct blob){w.p, w.n};
	}
	for(j = 0; j < 3; j++){ /* capture on: .fwd's READ checks make records; the sidecar acks */
		struct writer w = {0};
		u8(&w, (uint8_t)(0x80 | (0x11 * j)));
		connect_(&w, 0, 0x80 | 0x40, 0x05, "", 1234567891u);
		connect_(&w, 1, 2, 0x00, "", 3600);                   /* c1 */
		connect_(&w, 2, 1, 0x05, "", 3600);                   /* .fwd */
		acl(&w, 2, 2, "a/#");
		acl(&w, 2, 2, "a/b");
		acl(&w, 2, 2, "$share/g/a/#");
		capture_ack(&w, 1, 0, 0, 0, 0);                       /* resume */
		for(i = 0; i < 6; i++){                               /* routed to .fwd (slot 2) */
			message(&w, 1, (uint8_t)(32 | 16 | (i % 3)), i % 2 ? "a/b" : "a/c", "payload");
		}
		u8(&w, OP_TICK);
		capture_ack(&w, 2, 2, 2, 4, 0);                       /* ack 2, and 4, 5 */
		capture_ack(&w, 2, 3, 0, 0, j == 0 ? 0 : j);          /* then a damaged one */
		capture_ack(&w, 1, 1, 1, 3, 0);                       /* a new connection's resume */
		message(&w, 1, 32 | 1, "a/b", "again");
		u8(&w, OP_TICK);
		capture_ack(&w, 2, 9, 0, 0, 0);                       /* a seq not sent */
		b[n++] = (struct blob){w.p, w.n};
	}
	*out = b;
	*count = n;
}

const char *const FUZZ_DICTIONARY[] = {
	"\"cmd\":\"deliver\"", "\"cmd\":\"snapshot\"", "\"cmd\":\"resume\"", "\"cmd\":\"kick\"",
	"\"cmd\":\"deliver_batch\"", "\"messages\":[", "\"cmd\":\"queued\"", "\"clients\":[", "\"cmd\":\"unreleased\"", "\"cmd\":\"release\"", "\"mid\":", "\"subscription_ids\":[",
	"\"cmd\":\"deny\"", "\"cmd\":\"hold\"", "\"cmd\":\"admission\"", "\"cmd\":\"pressure\"", "\"cmd\":\"ack\"",
	"\"properties\":{\"user\":[[\"a\",\"b\"]]}", "\"correlation_data\":\"", "\"payload\":\"",
	"\"client\":\"mqfed-sidecar.fwd\"", "\"subscription\":\"$share/g/#\"", "\"qos\":2",
	"\"seq\":", "\"from_seq\":", "\"epoch\":", "1e308", "-1", "18446744073709551616", "0.5",
	"null", "true", "[]", "{}", "\"\\u0000\"", "\"\\ud800\"", "$mqfed/", "$SYS/broker/mqfed/",
	"$CONTROL/mqfed/v1", "$share/", "/#", "/+", "mqfed-sidecar", ".fwd", "====",
	"MQFB\x01", "MQFA\x01\x01", "MQFA\x01\x02", NULL,
};
