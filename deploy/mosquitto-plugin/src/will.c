/* A client's will, read from Mosquitto's internal `struct mosquitto` through a guarded read.
 *
 * The 2.0.11 plugin API does not expose the will. Mosquitto keeps it in `context->will` (a
 * `struct mosquitto_message_all`, set in handle_connect.c before the BASIC_AUTH callback runs)
 * and the Will Delay Interval in `context->will_delay_interval` (property_broker.c). The layout
 * below mirrors lib/mosquitto_internal.h of Debian's 2.0.11-1.2+deb12u2 with its patches applied
 * (the CVE-2021-34434 backport changes fields after these, not these) from `address` to
 * `will_delay_time`. What comes before `address` depends on build options (WITH_EPOLL adds
 * `ident`, WITH_ADNS adds `adns`; Debian builds with both), so the mirror is anchored at run time:
 * the first client with an id is scanned (8-byte steps, inside its allocation's
 * malloc_usable_size) for the one offset where `address`, `id`, `username` and `keepalive` all
 * equal what the public API returns (and `state` what mosquitto__get_state() does, when exported).
 *
 * Every later read checks the same fields at that offset for that client, and the will itself
 * before trusting it: inside its allocation, never linked into a list, QoS 0..2, a valid topic
 * inside its allocation, the payload inside its allocation. Any failure makes the will unknown
 * for the rest of the run (JSON null, one warning in the broker log): never a crash, never a
 * will that is not the client's. */
#include <malloc.h>
#include <stdlib.h>
#include <string.h>

#include "will.h"

extern int mosquitto__get_state(struct mosquitto *mosq) __attribute__((weak));

#define MOSQ_CS_DISCONNECTING 2 /* enum mosquitto_client_state: a DISCONNECT cleared the will */
#define SCAN_MAX 512             /* bytes of struct mosquitto scanned for the anchor */

struct mirror_packet {
	uint8_t *payload;
	void *next;
	uint32_t remaining_mult;
	uint32_t remaining_length;
	uint32_t packet_length;
	uint32_t to_process;
	uint32_t pos;
	uint16_t mid;
	uint8_t command;
	int8_t remaining_count;
};

struct mirror_message {   /* struct mosquitto_message (mosquitto.h) */
	int mid;
	char *topic;
	void *payload;
	int payloadlen;
	int qos;
	uint8_t retain;        /* bool */
};

struct mirror_will {      /* struct mosquitto_message_all */
	void *next;
	void *prev;
	mosquitto_property *properties;
	time_t timestamp;
	int state;
	uint8_t dup;           /* bool */
	struct mirror_message msg;
	uint32_t expiry_interval;
};

struct mirror_client {    /* struct mosquitto, from `address` on */
	char *address;
	char *id;
	char *username;
	char *password;
	uint16_t keepalive;
	uint16_t last_mid;
	int state;
	time_t last_msg_in;
	time_t next_msg_out;
	time_t ping_t;
	struct mirror_packet in_packet;
	void *current_out_packet;
	void *out_packet;
	struct mirror_will *will;
	void *aliases;
	void *will_delay_entry;
	int alias_count;
	int out_packet_count;
	uint32_t will_delay_interval;
	time_t will_delay_time;
};

enum will_state { WILL_PENDING = 0, WILL_OK = 1, WILL_UNKNOWN = 2 };

static enum will_state state;
static size_t anchor;

static void will_fail(const char *why)
{
	if(state != WILL_UNKNOWN){
		mosquitto_log_printf(MOSQ_LOG_WARNING,
				"mqfed: reading client wills failed (%s): wills are reported as unknown "
				"(null) from now on, and the cluster cannot publish them for a dead node", why);
	}
	state = WILL_UNKNOWN;
}

/* Whether the mirror at `off` matches this client's public fields. */
static bool anchored_at(struct mosquitto *client, size_t size, size_t off)
{
	struct mirror_client m;
	const char *username = mosquitto_client_username(client);

	if(off + sizeof(m) > size) return false;
	memcpy(&m, (const unsigned char *)client + off, sizeof(m));
	if(m.address != mosquitto_client_address(client) || m.id != mosquitto_client_id(client)
			|| m.username != username || m.keepalive != mosquitto_client_keepalive(client)){
		return false;
	}
	return mosquitto__get_state == NULL || m.state == mosquitto__get_state(client);
}

static bool locate(struct mosquitto *client, size_t size)
{
	size_t off, hit = 0;
	unsigned hits = 0;

	for(off = 0; off < SCAN_MAX && off + sizeof(struct mirror_client) <= size; off += 8){
		if(anchored_at(client, size, off)){
			hits++;
			hit = off;
		}
	}
	if(hits != 1){
		will_fail(hits ? "the client structure matched at several offsets"
				: "the client structure does not match Debian's 2.0.11 layout");
		return false;
	}
	anchor = hit;
	state = WILL_OK;
	return true;
}

/* The client's mirror, checked; false (and the read disabled) when it does not match. */
static bool read_client(struct mosquitto *client, struct mirror_client *out)
{
	size_t size;

	if(state == WILL_UNKNOWN || client == NULL) return false;
	if(mosquitto_client_id(client) == NULL){
		return false; /* nothing to anchor on: unknown for this client only */
	}
	size = malloc_usable_size(client);
	if(size < sizeof(*out) || size > (1u << 20)){
		will_fail("unexpected allocation size of the client structure");
		return false;
	}
	if(state == WILL_PENDING && !locate(client, size)) return false;
	if(!anchored_at(client, size, anchor)){
		will_fail("a client's fields moved");
		return false;
	}
	memcpy(out, (const unsigned char *)client + anchor, sizeof(*out));
	return true;
}

/* Mosquitto's packet identifier counter of this client (`last_mid`, next to the fields the
 * mirror is anchored on), through the same checked read; NULL when it does not match. */
uint16_t *client_last_mid(struct mosquitto *client)
{
	struct mirror_client m;

	if(!read_client(client, &m)) return NULL;
	return (uint16_t *)((unsigned char *)client + anchor + offsetof(struct mirror_client, last_mid));
}

/* The packet Mosquitto is reading from this client (`in_packet`: during the MESSAGE callback,
 * the PUBLISH being handled; its body is the variable header and payload, remaining_length
 * bytes), through the same checked read; false when it cannot be read. */
bool client_in_packet(struct mosquitto *client, const uint8_t **body, uint32_t *len,
		uint8_t *command)
{
	struct mirror_client m;

	if(!read_client(client, &m) || m.in_packet.payload == NULL) return false;
	if(malloc_usable_size(m.in_packet.payload) < m.in_packet.remaining_length) return false;
	*body = m.in_packet.payload;
	*len = m.in_packet.remaining_length;
	*command = m.in_packet.command;
	return true;
}

/* The will struct, checked before anything in it is trusted. */
static bool read_will(const struct mirror_will *p, struct mirror_will *w)
{
	size_t n;

	if(malloc_usable_size((void *)p) < sizeof(*w)){
		will_fail("the will is smaller than expected");
		return false;
	}
	memcpy(w, p, sizeof(*w));
	if(w->next || w->prev || w->msg.qos < 0 || w->msg.qos > 2 || w->msg.retain > 1
			|| w->msg.payloadlen < 0 || w->msg.topic == NULL
			|| (w->msg.payloadlen > 0) != (w->msg.payload != NULL)){
		will_fail("the will's fields are not plausible");
		return false;
	}
	n = malloc_usable_size(w->msg.topic);
	if(n == 0 || memchr(w->msg.topic, '\0', n) == NULL
			|| mosquitto_pub_topic_check(w->msg.topic) != MOSQ_ERR_SUCCESS){
		will_fail("the will's topic is not a valid topic");
		return false;
	}
	if(w->msg.payloadlen > 0 && malloc_usable_size(w->msg.payload) < (size_t)w->msg.payloadlen){
		will_fail("the will's payload is outside its allocation");
		return false;
	}
	return true;
}

/* `o.will`: {topic, payload (base64), qos, retain, delay, properties}, false when the client
 * has no will, null when it cannot be read. */
void will_add_json(cJSON *o, struct mosquitto *client)
{
	struct mirror_client m;
	struct mirror_will w;
	cJSON *j, *props;
	char *b64;

	if(!read_client(client, &m)){
		cJSON_AddNullToObject(o, "will");
		return;
	}
	if(m.will == NULL){
		cJSON_AddFalseToObject(o, "will");
		return;
	}
	if(!read_will(m.will, &w)){
		cJSON_AddNullToObject(o, "will");
		return;
	}
	j = cJSON_CreateObject();
	b64 = b64_encode(w.msg.payload, (size_t)w.msg.payloadlen, NULL);
	props = properties_to_json(w.properties);
	if(j == NULL || b64 == NULL || props == NULL){
		cJSON_Delete(j);
		cJSON_Delete(props);
		free(b64);
		cJSON_AddNullToObject(o, "will");
		return;
	}
	if(w.expiry_interval > 0){
		cJSON_AddNumberToObject(props, "message_expiry", w.expiry_interval);
	}
	cJSON_AddStringToObject(j, "topic", w.msg.topic);
	cJSON_AddStringToObject(j, "payload", b64);
	free(b64);
	cJSON_AddNumberToObject(j, "qos", w.msg.qos);
	cJSON_AddBoolToObject(j, "retain", w.msg.retain);
	cJSON_AddNumberToObject(j, "delay", m.will_delay_interval);
	cJSON_AddItemToObject(j, "properties", props);
	cJSON_AddItemToObject(o, "will", j);
}

/* `o.will`, at the DISCONNECT callback of a connection that is not taken over (Mosquitto sends
 * or queues the will right after it, context.c): "sent" (published now), "delayed" (after the
 * Will Delay Interval, unless the client comes back), "none" (no will, or a normal DISCONNECT or
 * a kick without will cleared it), null (unknown). */
void will_add_fate(cJSON *o, struct mosquitto *client)
{
	struct mirror_client m;

	if(!read_client(client, &m)){
		cJSON_AddNullToObject(o, "will");
	}else if(m.will == NULL || m.state == MOSQ_CS_DISCONNECTING){
		cJSON_AddStringToObject(o, "will", "none");
	}else{
		cJSON_AddStringToObject(o, "will", m.will_delay_interval > 0 ? "delayed" : "sent");
	}
}

void will_cleanup(void)
{
	state = WILL_PENDING;
	anchor = 0;
}
