/*
 * mqfed Mosquitto plugin: shared state and internal interfaces.
 *
 * The plugin is single threaded: Mosquitto 2.0 calls every callback from its main loop.
 * The contract with the sidecar is docs/plugin-protocol.md.
 */
#ifndef MQFED_H
#define MQFED_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <time.h>

#include <cjson/cJSON.h>
#include <mosquitto.h>
#include <mosquitto_broker.h>
#include <mosquitto_plugin.h>
#include <mqtt_protocol.h>

#include "uthash.h"

#define MQFED_VERSION "0.1.0"
#define MQFED_EVENTS_TOPIC "$SYS/broker/mqfed/events"
#define MQFED_CONTROL_TOPIC "$CONTROL/mqfed/v1"
#define MQFED_REPLY_PREFIX "$SYS/broker/mqfed/replies/"
#define MQFED_SIDECAR_USER "mqfed-sidecar"
#define MQFED_FWD_SUFFIX ".fwd"
#define MQFED_CALIB_EXPIRY 1234567891u

/* session expiry value meaning "not known" (v5 client and calibration not ok) */
#define EXPIRY_UNKNOWN (-1LL)
#define EXPIRY_NEVER ((int64_t)UINT32_MAX)

enum calib_state { CALIB_PENDING = 0, CALIB_OK = 1, CALIB_UNKNOWN = 2 };

struct sub {
	UT_hash_handle hh;
	char *filter;
	uint8_t qos;
};

/* One client id known to the plugin: an online connection or an offline persistent session. */
struct client {
	UT_hash_handle hh; /* keyed by id */
	char *id;
	char *username;
	int protocol;              /* 3, 4 or 5 */
	bool clean_start;
	int64_t expiry;            /* session expiry interval (s), EXPIRY_UNKNOWN if not known */
	int keepalive;
	bool online;
	struct mosquitto *conn;    /* valid only while online */
	time_t expire_at;          /* offline with a finite known expiry: wall clock second; else 0 */
	struct sub *subs;
	unsigned sub_count;
	unsigned shared_count;     /* of which $share/<group>/... */
	/* the READ checks Mosquitto makes for this client while routing one re-injected message
	 * (origin.c): which run, how many checks so far, matching plain / shared subscriptions */
	uint64_t run_seq;
	const char *run_topic;     /* identity only, never dereferenced */
	unsigned run_checks;
	unsigned run_plain;
	unsigned run_shared;
};

/* A connection that passed our BASIC_AUTH callback; later providers may still refuse it. */
struct pending {
	UT_hash_handle hh; /* keyed by conn pointer */
	struct mosquitto *conn;
	char *id;
	char *username;
	bool clean_start;
	bool have_old_expiry;      /* expiry of the live connection it is about to take over */
	int64_t old_expiry;
	uint64_t order;            /* resolution order */
};

struct deny {
	UT_hash_handle hh;
	char *id;
	bool refuse;
};

struct event {
	char *json;
	size_t len;
};

/* A message as plugin callbacks see it (origin.c). Mosquitto passes the MESSAGE callback and
 * every READ check of a routed message the same msg-store topic and payload pointers. */
struct fwd_fp {
	const char *topic;         /* identity only while the message lives */
	const void *payload;       /* NULL for an empty payload */
	uint32_t len;
	uint8_t qos;
	uint64_t hash;             /* of the topic and payload contents */
};

/* A QoS 2 message published by the forwarding connection, routed later at its PUBREL. */
struct fwd_q2 {
	UT_hash_handle hh;         /* keyed by fp.topic (pointer) */
	struct fwd_fp fp;
	int64_t born_ms;
	bool hit;                  /* a READ check of its routing was seen */
	struct fwd_q2 *next_hit;
};

/* A filter the forwarding connection subscribes to (shed.c). */
struct fwd_filter {
	UT_hash_handle hh;         /* keyed by filter, verbatim */
	char *filter;
	const char *match;         /* filter without $share/<group>/ */
};

struct mqfed {
	mosquitto_plugin_id_t *pid;

	/* options */
	char *secret;
	char *sidecar_id;
	char *fwd_id;          /* "<sidecar_id>.fwd": the sidecar's forwarding connection */
	bool auth_grant;
	bool acl_grant;
	uint64_t window;
	uint64_t buf_max_events;
	uint64_t buf_max_bytes;
	long heartbeat_ms;
	unsigned snapshot_chunk;

	char epoch[17];

	/* event stream: the buffer holds seqs [next_seq - ring_len, next_seq) */
	uint64_t next_seq;
	struct event *ring;
	size_t ring_cap;
	size_t ring_head;
	size_t ring_len;
	uint64_t buf_bytes;
	uint64_t acked;
	uint64_t pub_next;
	bool publishing;
	uint64_t events_total;
	uint64_t overflows;

	/* the authenticated sidecar connection */
	struct mosquitto *sidecar;
	/* the authenticated forwarding connection (hot path; trusted, never reported) */
	struct mosquitto *fwd;

	/* model */
	struct client *clients;
	unsigned n_online;
	uint64_t n_subs;
	struct pending *pending;
	uint64_t pending_order;
	struct deny *denies;
	uint64_t denied_connects;

	/* calibration of session_expiry_interval inside struct mosquitto */
	enum calib_state calib;
	size_t calib_offset;

	/* re-check detection */
	struct mosquitto *kicking;
	bool nested;

	/* timers */
	int64_t last_heartbeat_ms;
	time_t last_expiry_check;

	/* re-injected messages vs shared subscriptions (origin.c) */
	uint64_t fwd_q2_max;       /* option fwd_qos2_max */
	uint64_t hash_seed;
	uint64_t run_seq;          /* bumped by every callback other than a READ check */
	bool fwd_cur_set;          /* a QoS 0/1 message of .fwd: routed before the next callback */
	struct fwd_fp fwd_cur;
	struct fwd_q2 *fwd_q2;     /* QoS 2 messages of .fwd awaiting PUBREL, oldest first */
	struct fwd_q2 *fwd_hits;   /* entries whose routing ran: dropped at the next callback */
	time_t fwd_drop_at;        /* .fwd offline with a session: forget all entries at this time */
	uint64_t fwd_denied;       /* deliveries to shared subscriptions refused */
	uint64_t fwd_q2_evicted;   /* entries forgotten before their routing (cap, age, session) */

	/* overload shedding (shed.c) */
	struct fwd_filter *fwd_filters;
	uint64_t fwd_backlog_max;  /* option fwd_backlog_max: 0 = never shed on the estimate */
	uint64_t fwd_since_report; /* QoS>0 copies routed to .fwd since the sidecar's last report */
	uint64_t fwd_unread;       /* routed to .fwd, not taken by the sidecar (at its last report) */
	uint64_t fwd_reported_unacked;
	uint64_t fwd_taken_seen;   /* the sidecar's running count of copies taken, last reported */
	int64_t shed_until_ms;     /* the sidecar's lease: shed while now_ms() < this */
	uint64_t shed_total;       /* publishers disconnected */
	int64_t shed_logged_ms;
};

extern struct mqfed g;

/* util.c */
int64_t now_ms(void);
char *xstrdup(const char *s);
bool streq(const char *a, const char *b);
char *b64_encode(const void *data, size_t len, size_t *out_len);
int b64_decode(const char *in, unsigned char **out, size_t *out_len);
bool topic_in_subtree(const char *topic, const char *root);
const char *strip_share(const char *filter);
uint64_t hash_bytes(uint64_t h, const void *data, size_t len);
void cjson_add_str_or_null(cJSON *o, const char *key, const char *v);
void cjson_add_expiry(cJSON *o, const char *key, int64_t v);
cJSON *properties_to_json(const mosquitto_property *props);
int properties_from_json(const cJSON *j, mosquitto_property **props);

/* events.c */
int events_init(void);
void events_cleanup(void);
cJSON *ev_new(const char *type);
void ev_emit(cJSON *ev);
void ev_publish_pending(void);
void ev_ack(uint64_t seq);
bool ev_resume(uint64_t from_seq, uint64_t *oldest);
uint64_t ev_snapshot_cut(void);
uint64_t ev_oldest(void);

/* shed.c */
void shed_fwd_filter(const char *filter, bool subscribed);
void shed_fwd_routed(uint8_t qos);
void shed_report(uint64_t unacked, uint64_t taken, int64_t lease_ms);
void shed_fwd_connected(void);
uint64_t shed_backlog(void);
bool shed_active(void);
bool shed_publish(struct mosquitto *client, const char *topic, uint8_t qos);
void shed_cleanup(void);

/* calib.c */
void calib_on_sidecar_auth(struct mosquitto *client);
bool is_sidecar_id(const char *id);
int64_t client_expiry(struct mosquitto *client);
const char *calib_name(void);

/* model.c */
void model_cleanup(void);
struct client *model_find(const char *id);
struct pending *pending_find(struct mosquitto *conn);
struct pending *pending_find_id(const char *id, struct mosquitto *not_conn);
void pending_add(struct mosquitto *conn, const char *id, const char *username);
void pending_drop(struct pending *p);
void pending_reject(struct pending *p);
void pending_resolve(struct pending *p);
void pending_resolve_all(void);
struct client *model_client_for_event(struct mosquitto *conn, bool adopt);
void model_on_disconnect(struct mosquitto *conn);
void model_subscribe(struct client *c, const char *filter, uint8_t qos);
void model_unsubscribe(struct client *c, const char *filter);
void model_expire_sessions(time_t now);
void model_fill_unknown_expiry(void);
unsigned model_sessions(void);
cJSON *model_client_json(struct client *c);
void emit_connect_rejected(const char *id, const char *username, const char *reason);

/* origin.c */
void origin_event(void);
void origin_on_message(const struct mosquitto_evt_message *ed);
bool origin_read_denied(struct mosquitto *client, const char *topic, const void *payload,
		uint32_t payloadlen, uint8_t qos, bool retain);
void origin_fwd_auth(struct mosquitto *client);
void origin_fwd_disconnect(struct mosquitto *client);
void origin_tick(void);
unsigned origin_tracked(void);
void origin_cleanup(void);

/* commands.c */
int on_control(int event, void *event_data, void *userdata);
void deny_cleanup(void);
struct deny *deny_find(const char *id);
unsigned deny_count(void);

#endif
