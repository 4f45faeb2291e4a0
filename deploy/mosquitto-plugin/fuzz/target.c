/* The fuzz target: runs one input against a fresh plugin in the fake broker (broker.c).
 *
 * An input is a program: a first byte choosing the plugin's options, then operations, each
 * an opcode byte and its arguments (bytes; strings are a 2-byte length and that many bytes).
 * Whatever the bytes, the program is valid: short reads give zeros and empty strings. So
 * byte-level mutations explore the command decoder (JSON of any shape on the control topic,
 * from the sidecar or anyone), the batch parser (inject.c, batch.c), the access decisions (any topic or filter, any identity on any
 * kind of listener), message properties and the model, in any order of events, and with
 * capture on (the first byte's bit 7) the records of `.fwd`'s READ checks and the parser of the
 * sidecar's acks on the capture socket (capbuf.c: a socketpair stands for the connection). */
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "broker.h"
#include "capbuf.h"
#include "capture.h"
#include "target.h"

int mosquitto_plugin_init(mosquitto_plugin_id_t *identifier, void **userdata,
		struct mosquitto_opt *options, int option_count);
int mosquitto_plugin_cleanup(void *userdata, struct mosquitto_opt *options, int option_count);

#define SECRET "fuzz-secret"
#define SIDECAR "mqfed-sidecar"

struct input {
	const uint8_t *p;
	size_t n;
};

static uint8_t u8(struct input *in)
{
	uint8_t v = 0;

	if(in->n){
		v = *in->p++;
		in->n--;
	}
	return v;
}

static uint32_t u32(struct input *in)
{
	uint32_t v = u8(in);

	v = v << 8 | u8(in);
	v = v << 8 | u8(in);
	return v << 8 | u8(in);
}

/* A malloc'd copy of the next string (NUL-terminated; may hold no NUL before its end). */
static char *str(struct input *in, size_t *len_out)
{
	size_t len = (size_t)u8(in) << 8;
	char *s;

	len |= u8(in);
	if(len > in->n) len = in->n;
	s = malloc(len + 1);
	if(s == NULL) abort();
	memcpy(s, in->p, len);
	s[len] = '\0';
	in->p += len;
	in->n -= len;
	if(len_out) *len_out = len;
	return s;
}

/* Ids a program picks from (byte % count), or a string of its own (the last choice). */
static const char *const IDS[] = {
	SIDECAR, SIDECAR ".fwd", "c1", "c2", "c3", SIDECAR "-0123456789abcdef", "shadow", NULL,
};
static const char *const ADDRESSES[] = {FAKE_SOCKET, "/tmp/other.sock", "127.0.0.1", "::1", NULL};

struct run {
	struct mosquitto *slot[FUZZ_SLOTS];
	int capture_peer;          /* the sidecar's end of the capture connection, or -1 */
};

static struct mosquitto *slot_client(struct run *r, struct input *in)
{
	return r->slot[u8(in) % FUZZ_SLOTS];
}

static void op_connect(struct run *r, struct input *in)
{
	unsigned k = u8(in) % FUZZ_SLOTS;
	uint8_t pick = u8(in), flags = u8(in);
	char *own = str(in, NULL), *user = str(in, NULL), *pass = str(in, NULL);
	uint32_t expiry = u32(in);
	const char *id = IDS[pick % (sizeof(IDS) / sizeof(IDS[0]))];
	const char *username = (flags & 1) ? SIDECAR : (flags & 2) ? NULL : user;
	const char *password = (flags & 4) ? SECRET : (flags & 8) ? NULL : pass;
	const char *address = ADDRESSES[(flags >> 4) % (sizeof(ADDRESSES) / sizeof(ADDRESSES[0]))];
	bool identity_listener = flags & 0x80; /* use_identity_as_username: no BASIC_AUTH */
	struct mosquitto *c, *old;
	struct mosquitto_evt_basic_auth ed;
	int rc = MOSQ_ERR_SUCCESS;

	if(id == NULL) id = own;
	if(pick & 0x80) expiry = 1234567891u; /* the calibration value */
	c = broker_new_client(id, username, address, 3 + (pick >> 5) % 3, (pick & 0x10) != 0,
			expiry);
	if(!identity_listener){
		memset(&ed, 0, sizeof(ed));
		ed.client = c;
		ed.username = (char *)username;
		ed.password = (char *)password;
		rc = broker_call(MOSQ_EVT_BASIC_AUTH, &ed);
		if(rc == MOSQ_ERR_PLUGIN_DEFER) rc = (flags & 0x40) ? MOSQ_ERR_AUTH : MOSQ_ERR_SUCCESS;
	}
	if(rc != MOSQ_ERR_SUCCESS){
		free(c->id); /* handle_connect_error: the id is gone before the disconnect */
		c->id = NULL;
		broker_disconnect(c, false);
	}else{
		old = broker_find_live(c->id);
		if(old && old != c){ /* a takeover: the old connection (or session) first */
			old->state = FAKE_CS_DUPLICATE;
			broker_disconnect(old, false);
		}
		c->state = FAKE_CS_ACTIVE;
		r->slot[k] = c;
	}
	free(own);
	free(user);
	free(pass);
}

static void op_disconnect(struct run *r, struct input *in)
{
	struct mosquitto *c = slot_client(r, in);
	bool keep = u8(in) & 1;

	if(c && c->state == FAKE_CS_ACTIVE) broker_disconnect(c, keep);
}

/* A PUBLISH of a slot's client to one of the plugin's $CONTROL topics. */
static void control_to(struct run *r, struct input *in, const char *topic)
{
	struct mosquitto *c = slot_client(r, in);
	struct mosquitto_evt_control ed;
	size_t len;
	char *payload = str(in, &len);

	if(c && c->state == FAKE_CS_ACTIVE){
		memset(&ed, 0, sizeof(ed));
		ed.client = c;
		ed.topic = topic;
		ed.payload = payload;
		ed.payloadlen = (uint32_t)len;
		ed.qos = 1;
		broker_call(MOSQ_EVT_CONTROL, &ed);
	}
	free(payload);
}

static void op_control(struct run *r, struct input *in)
{
	control_to(r, in, "$CONTROL/mqfed/v1");
}

static void op_inject(struct run *r, struct input *in)
{
	control_to(r, in, "$CONTROL/mqfed/inject");
}

static void op_acl(struct run *r, struct input *in)
{
	struct mosquitto *c = slot_client(r, in);
	uint8_t access = u8(in), bits = u8(in);
	size_t len;
	char *topic = str(in, NULL), *payload = str(in, &len);
	struct mosquitto_evt_acl_check ed;

	if(c && !c->doomed){
		memset(&ed, 0, sizeof(ed));
		ed.client = c;
		ed.topic = topic;
		ed.payload = payload;
		ed.payloadlen = (uint32_t)len;
		ed.access = 1 << (access % 4); /* READ, WRITE, SUBSCRIBE, UNSUBSCRIBE */
		ed.qos = bits % 3;
		ed.retain = bits & 4;
		broker_call(MOSQ_EVT_ACL_CHECK, &ed);
		if(ed.access == MOSQ_ACL_SUBSCRIBE && (bits & 8)) c->sub_count++;
	}
	free(topic);
	free(payload);
}

static mosquitto_property *properties(struct input *in)
{
	mosquitto_property *props = NULL;
	uint8_t count = u8(in) % 6, i;

	for(i = 0; i < count; i++){
		uint8_t kind = u8(in);
		size_t len;
		char *a = str(in, &len), *b = str(in, NULL);
		switch(kind % 6){
			case 0:
				mosquitto_property_add_string_pair(&props, MQTT_PROP_USER_PROPERTY, a, b);
				break;
			case 1:
				mosquitto_property_add_string(&props, MQTT_PROP_CONTENT_TYPE, a);
				break;
			case 2:
				mosquitto_property_add_string(&props, MQTT_PROP_RESPONSE_TOPIC, a);
				break;
			case 3:
				mosquitto_property_add_binary(&props, MQTT_PROP_CORRELATION_DATA, a,
						(uint16_t)(len > UINT16_MAX ? UINT16_MAX : len));
				break;
			case 4:
				mosquitto_property_add_byte(&props, MQTT_PROP_PAYLOAD_FORMAT_INDICATOR, kind & 1);
				break;
			default:
				mosquitto_property_add_int32(&props, MQTT_PROP_MESSAGE_EXPIRY_INTERVAL, kind);
				break;
		}
		free(a);
		free(b);
	}
	return props;
}

/* A client's PUBLISH: the MESSAGE event, then (if accepted) the READ checks of its routing to
 * each other client, with the same topic and payload pointers, as Mosquitto does. */
static void op_message(struct run *r, struct input *in)
{
	struct mosquitto *c = slot_client(r, in);
	uint8_t bits = u8(in);
	size_t len;
	char *topic = str(in, NULL), *payload = str(in, &len);
	mosquitto_property *props = properties(in);
	struct mosquitto_evt_message ed;
	struct mosquitto_evt_acl_check acl;
	unsigned k;
	int rc;

	if(c && c->state == FAKE_CS_ACTIVE){
		memset(&ed, 0, sizeof(ed));
		ed.client = c;
		ed.topic = topic;
		ed.payload = payload;
		ed.payloadlen = (uint32_t)len;
		ed.qos = bits % 3;
		ed.retain = bits & 4;
		ed.properties = props;
		rc = broker_call(MOSQ_EVT_MESSAGE, &ed);
		for(k = 0; rc == MOSQ_ERR_SUCCESS && k < FUZZ_SLOTS; k++){
			struct mosquitto *to = r->slot[k];
			if(to == NULL || to->doomed || !(bits & (8u << (k % 5)))) continue;
			memset(&acl, 0, sizeof(acl));
			acl.client = to;
			acl.topic = topic;
			acl.payload = payload;
			acl.payloadlen = (uint32_t)len;
			acl.access = MOSQ_ACL_READ;
			acl.qos = ed.qos;
			acl.retain = ed.retain;
			broker_call(MOSQ_EVT_ACL_CHECK, &acl);
		}
	}
	mosquitto_property_free_all(&props);
	free(topic);
	free(payload);
}

/* Bytes from the sidecar on the capture socket: a connection is made first when there is none
 * (the plugin closed the last one after a malformed message). */
static void op_capture(struct run *r, struct input *in)
{
	size_t len;
	char *bytes = str(in, &len);
	char sink[4096];
	ssize_t n = 1;
	int sv[2];

	if(capture_enabled()){
		if(r->capture_peer >= 0){
			while((n = read(r->capture_peer, sink, sizeof(sink))) > 0){} /* what it wrote */
			if(n == 0){ /* the plugin closed its end */
				close(r->capture_peer);
				r->capture_peer = -1;
			}
		}
		if(r->capture_peer < 0
				&& socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, sv) == 0){
			capbuf_attach(sv[0]);
			r->capture_peer = sv[1];
		}
		capbuf_feed((const uint8_t *)bytes, len);
	}
	free(bytes);
}

static void op_tick(struct run *r)
{
	struct mosquitto_evt_tick ed;
	unsigned k;

	memset(&ed, 0, sizeof(ed));
	broker_call(MOSQ_EVT_TICK, &ed);
	for(k = 0; k < FUZZ_SLOTS; k++){
		if(r->slot[k] && r->slot[k]->doomed) r->slot[k] = NULL;
	}
	broker_free_doomed();
}

static void op_ext_auth(struct run *r, struct input *in)
{
	struct mosquitto *c = slot_client(r, in);
	struct mosquitto_evt_extended_auth ed;

	if(c && c->state == FAKE_CS_ACTIVE){
		memset(&ed, 0, sizeof(ed));
		ed.client = c;
		ed.auth_method = "SCRAM-SHA-1";
		broker_call(MOSQ_EVT_EXT_AUTH_START, &ed);
	}
}

static int fake_pid;
static const int VERDICTS[] = {MOSQ_ERR_SUCCESS, MOSQ_ERR_ACL_DENIED, MOSQ_ERR_PLUGIN_DEFER,
	MOSQ_ERR_AUTH};

int mqfed_fuzz_one(const uint8_t *data, size_t size)
{
	struct input in = {data, size};
	struct run r;
	uint8_t conf = u8(&in);
	struct mosquitto_opt opts[10];
	int n = 0;
	void *userdata = NULL;
	unsigned steps = 0;

	memset(&r, 0, sizeof(r));
	r.capture_peer = -1;
	broker_reset();
	opts[n++] = (struct mosquitto_opt){"sidecar_secret", SECRET};
	opts[n++] = (struct mosquitto_opt){"acl", (conf & 1) ? "defer" : "grant"};
	opts[n++] = (struct mosquitto_opt){"auth", (conf & 2) ? "defer" : "grant"};
	opts[n++] = (struct mosquitto_opt){"event_window", (conf & 4) ? "2" : "500"};
	opts[n++] = (struct mosquitto_opt){"event_batch", (conf & 8) ? "3" : "1"};
	opts[n++] = (struct mosquitto_opt){"sessions_gate", (conf & 16) ? "true" : "false"};
	opts[n++] = (struct mosquitto_opt){"message_size_limit", (conf & 32) ? "64" : "0"};
	opts[n++] = (struct mosquitto_opt){"sidecar_socket", (conf & 64) ? FAKE_SOCKET : ""};
	if(!(conf & 64)) n--;
	if(conf & 128){
		opts[n++] = (struct mosquitto_opt){"capture_socket", "/nonexistent/mqfed-fuzz.sock"};
		opts[n++] = (struct mosquitto_opt){"capture_max_bytes", "65536"};
	}
	if(mosquitto_plugin_init((mosquitto_plugin_id_t *)&fake_pid, &userdata, opts, n)
			!= MOSQ_ERR_SUCCESS){
		abort();
	}

	while(in.n > 0 && steps++ < 4096){
		switch(u8(&in) % OP_COUNT){
			case OP_CONNECT: op_connect(&r, &in); break;
			case OP_DISCONNECT: op_disconnect(&r, &in); break;
			case OP_CONTROL: op_control(&r, &in); break;
			case OP_ACL: op_acl(&r, &in); break;
			case OP_MESSAGE: op_message(&r, &in); break;
			case OP_TICK: op_tick(&r); break;
			case OP_EXT_AUTH: op_ext_auth(&r, &in); break;
			case OP_INJECT: op_inject(&r, &in); break;
			case OP_CAPTURE: op_capture(&r, &in); break;
			default: broker_set_later_verdict(VERDICTS[u8(&in) % 4]); break;
		}
	}
	mosquitto_plugin_cleanup(userdata, opts, n);
	if(r.capture_peer >= 0) close(r.capture_peer);
	broker_free_all();
	return 0;
}

/* libFuzzer's entry point, for a clang build (`-fsanitize=fuzzer`). */
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	return mqfed_fuzz_one(data, size);
}
