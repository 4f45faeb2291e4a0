/*
 * Links out (issue 25, slice 3; docs/architecture.md "The C bridge", docs/plugin-protocol.md
 * "Links"): one MQTT 3.1.1 connection per peer, from this plugin to the peer's Mosquitto,
 * publishing MQFB batches of captured records to `$CONTROL/mqfed/inject` at QoS 1, where the
 * peer's plugin injects them (inject.c, linkin.c). Everything runs on Mosquitto's own thread at
 * the TICK, on non-blocking sockets: a connect, a write that does not fit, or a PUBACK not
 * read yet waits for the next TICK (every loop iteration under load, every 100 ms idle). No
 * thread, no wakeup: the slice 3 probe measured a hop and CPU like a bridge's that way.
 *
 * The sidecar sets the links (`links`: peer, numeric address, credentials) and each link's
 * filters (`link_filters`: the peer's plain interest, a counted trie). Capture offers each
 * record here first (linkout_take): it goes to every link whose filters match, under the
 * links' own seq, with this node's id as its origin, or to none when one of them has no
 * room (then the capture socket takes it, as before).
 *
 * A record stays until its batch is PUBACKed. Batches are sealed at the TICK (or when one is
 * full), written in order, at most WINDOW unacknowledged; after a reconnect every batch not
 * acknowledged is written again, in order (DUP set), and the receiving plugin drops the records
 * it already injected (linkin.c: by seq, per link connection). A PUBACK follows the injection
 * (Mosquitto's control__process acks after the plugin's callback), so an acknowledged record is
 * in the peer's Mosquitto.
 *
 * Not built yet (the sidecar does not set links: nothing of this runs in the product): the
 * hand-over of a down link's records to the sidecar's spill, the journal's confirmations of
 * link records, the catch-up ring, traces, and the receiver's pacing (docs/architecture.md).
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "batch.h"
#include "ftrie.h"
#include "inject.h"
#include "linkout.h"
#include "room.h"

#define LINKS_MAX 64
#define BATCH_BYTES_MAX (256u << 10)   /* records per batch, unless one record is larger */
#define BATCH_RECORDS_MAX 4096u
#define WINDOW 32u                     /* batches written and not PUBACKed */
#define LINK_BYTES_MAX ((uint64_t)64 << 20) /* record bytes held per link */
#define KEEPALIVE_S 60
#define PING_AFTER_MS 20000            /* nothing written this long: PINGREQ */
#define DEAD_AFTER_MS 75000            /* nothing read this long: the connection is dead */
#define CONNECT_TIMEOUT_MS 5000
#define BACKOFF_MIN_MS 100
#define BACKOFF_MAX_MS 5000
#define CTL_MAX 512                    /* CONNECT (ids and credentials bounded), PINGREQ */
#define IN_MAX 2048                    /* CONNACK, PUBACK, PINGRESP, inject replies */
#define UNANSWERED_MAX 256             /* batches written whose inject reply has not come */
#define REPLY_WAIT_MS 2000             /* a reply not come by then: answered without a measure */

enum state { L_DOWN, L_CONNECTING, L_CONNACK, L_UP };

/* A sealed batch: the whole PUBLISH packet. */
struct batch {
	struct batch *next;
	uint64_t id;                   /* the MQFB batch id, which the peer's reply names */
	uint32_t records;
	bool tried;                    /* written (part of it) on an earlier connection */
	bool sent;                     /* written whole on this connection, not PUBACKed */
	uint16_t mid;
	size_t mid_at;                 /* offset of the packet id in pkt */
	size_t len;
	size_t bytes;                  /* record bytes (for held_bytes) */
	uint8_t pkt[];
};

struct link {
	char *peer;
	char *host;
	int port;
	char *username;
	char *password;
	char *client_id;
	struct sockaddr_storage addr;
	socklen_t addr_len;
	struct ftrie trie;
	enum state st;
	int fd;
	uint8_t *rec;                  /* records of the batch being built */
	size_t rec_len, rec_cap;
	uint32_t rec_count;
	struct batch *head, *tail;     /* sealed, oldest first */
	struct batch *wr;              /* the next to write (or being written) */
	size_t wr_off;
	unsigned inflight;
	uint8_t ctl[CTL_MAX];          /* a control packet to write first */
	size_t ctl_len, ctl_off;
	uint8_t in[IN_MAX];
	size_t in_len;
	uint16_t next_mid;
	uint64_t batch_id;
	uint64_t held_bytes;
	int64_t retry_at, started_ms, read_ms, write_ms;
	unsigned backoff;
	bool listed;                   /* (configure) named again */
	struct ratelog log;
	struct room room;              /* the peer's subscribers' queue room (room.c) */
	struct unanswered {
		uint64_t id;
		uint32_t records;
		int64_t at_ms;
	} ua[UNANSWERED_MAX];          /* a ring, oldest first */
	unsigned ua_head, ua_n;
	int64_t probe_ms;
	uint64_t records, batches, acked, resent, connects, failures, paced, lifted;
	uint64_t acked_records;        /* records of the PUBACKed batches (a barrier's measure) */
};

static struct link *links[LINKS_MAX];
static unsigned n_links;
static char *node_id;
static uint64_t n_refused, n_abandoned;
static uint64_t link_seq, last_hlc;

/* ---- configuration ------------------------------------------------------------------------- */

static void batch_free_all(struct link *l)
{
	struct batch *b;

	while((b = l->head) != NULL){
		l->head = b->next;
		free(b);
	}
	l->tail = l->wr = NULL;
	l->wr_off = 0;
	l->inflight = 0;
}

static void link_close(struct link *l, bool failed)
{
	struct batch *b;
	int64_t now = mono_ms();

	if(l->fd >= 0) close(l->fd);
	l->fd = -1;
	if(failed){
		l->failures++;
		l->backoff = l->backoff ? l->backoff * 2 : BACKOFF_MIN_MS;
		if(l->backoff > BACKOFF_MAX_MS) l->backoff = BACKOFF_MAX_MS;
	}
	l->retry_at = now + (failed ? l->backoff : 0);
	l->st = L_DOWN;
	l->ctl_len = l->ctl_off = l->in_len = 0;
	for(b = l->head; b; b = b->next){ /* all of them go again, in order */
		if(b->sent || (b == l->wr && l->wr_off > 0)) b->tried = true;
		b->sent = false;
	}
	l->wr = l->head;
	l->wr_off = 0;
	l->inflight = 0;
	l->ua_head = l->ua_n = 0;
	room_reset(&l->room);
}

static void link_free(struct link *l)
{
	struct batch *b;

	if(l == NULL) return;
	if(l->fd >= 0) close(l->fd);
	for(b = l->head; b; b = b->next) n_abandoned += b->records;
	n_abandoned += l->rec_count;
	batch_free_all(l);
	ftrie_free(&l->trie);
	free(l->rec);
	free(l->peer);
	free(l->host);
	free(l->username);
	free(l->password);
	free(l->client_id);
	free(l);
}

static struct link *find(const char *peer)
{
	unsigned i;

	for(i = 0; i < n_links; i++){
		if(streq(links[i]->peer, peer)) return links[i];
	}
	return NULL;
}

/* A numeric address (no name lookup on Mosquitto's thread: the sidecar resolves). */
static bool parse_addr(const char *host, int port, struct sockaddr_storage *ss, socklen_t *len)
{
	struct sockaddr_in *v4 = (struct sockaddr_in *)ss;
	struct sockaddr_in6 *v6 = (struct sockaddr_in6 *)ss;

	memset(ss, 0, sizeof(*ss));
	if(inet_pton(AF_INET, host, &v4->sin_addr) == 1){
		v4->sin_family = AF_INET;
		v4->sin_port = htons((uint16_t)port);
		*len = sizeof(*v4);
		return true;
	}
	if(inet_pton(AF_INET6, host, &v6->sin6_addr) == 1){
		v6->sin6_family = AF_INET6;
		v6->sin6_port = htons((uint16_t)port);
		*len = sizeof(*v6);
		return true;
	}
	return false;
}

static bool same_str(const char *a, const char *b)
{
	return a && b && strcmp(a, b) == 0;
}

static bool short_utf8(const char *s)
{
	size_t n = s ? strlen(s) : 0;

	return n > 0 && n <= 100 && mosquitto_validate_utf8(s, (int)n) == MOSQ_ERR_SUCCESS;
}

/* Check one entry of `links`; NULL or why not. */
static const char *check_entry(const cJSON *e, const char **peer, const char **host, int *port,
		const char **user, const char **pass)
{
	const cJSON *p = cJSON_GetObjectItemCaseSensitive(e, "port");
	struct sockaddr_storage ss;
	socklen_t len;

	*peer = cjson_get_str(e, "peer");
	*host = cjson_get_str(e, "host");
	*user = cjson_get_str(e, "username");
	*pass = cjson_get_str(e, "password");
	if(!cJSON_IsObject(e)) return "a link is not an object";
	if(!short_utf8(*peer) || strchr(*peer, '/') || strchr(*peer, '+') || strchr(*peer, '#')){
		return "peer: 1-100 characters, no '/', '+' or '#'";
	}
	if(!cJSON_IsNumber(p) || p->valuedouble < 1 || p->valuedouble > 65535
			|| p->valuedouble != (int)p->valuedouble){
		return "port: 1-65535";
	}
	*port = (int)p->valuedouble;
	if(*host == NULL || !parse_addr(*host, *port, &ss, &len)) return "host: a numeric address";
	if(!short_utf8(*user) || *pass == NULL || strlen(*pass) > 200) return "credentials";
	return NULL;
}

const char *linkout_configure(const cJSON *req, const char **why)
{
	const cJSON *list = cJSON_GetObjectItemCaseSensitive(req, "links"), *e;
	const char *node = cjson_get_str(req, "node"), *peer, *host, *user, *pass;
	struct link *l;
	char id[256];
	int port, n = 0;
	unsigned i;

	*why = NULL;
	if(!cJSON_IsArray(list) || !short_utf8(node)){
		*why = "links: an array, node: a node id";
		return "bad_request";
	}
	cJSON_ArrayForEach(e, list){
		if((*why = check_entry(e, &peer, &host, &port, &user, &pass)) != NULL) return "bad_request";
		if(++n > LINKS_MAX){
			*why = "more than 64 links";
			return "bad_request";
		}
	}
	if(node_id && !streq(node_id, node)){
		*why = "the node id cannot change";
		return "bad_request";
	}
	if(node_id == NULL && (node_id = xstrdup(node)) == NULL) return "internal";
	for(i = 0; i < n_links; i++) links[i]->listed = false;
	cJSON_ArrayForEach(e, list){
		(void)check_entry(e, &peer, &host, &port, &user, &pass);
		l = find(peer);
		if(l && same_str(l->host, host) && l->port == port && same_str(l->username, user)
				&& same_str(l->password, pass)){
			l->listed = true;
			continue;
		}
		if(l == NULL){
			l = calloc(1, sizeof(*l));
			if(l == NULL) return "internal";
			l->fd = -1;
			l->peer = xstrdup(peer);
			snprintf(id, sizeof(id), "%s%s.%llx", LINK_ID_PREFIX, node_id,
					(unsigned long long)now_ms());
			l->client_id = xstrdup(id);
			if(l->peer == NULL || l->client_id == NULL){
				link_free(l);
				return "internal";
			}
			links[n_links++] = l;
		}else{
			link_close(l, false); /* somewhere else now: its batches go there */
		}
		free(l->host);
		free(l->username);
		free(l->password);
		l->host = xstrdup(host);
		l->username = xstrdup(user);
		l->password = xstrdup(pass);
		l->port = port;
		(void)parse_addr(host, port, &l->addr, &l->addr_len);
		l->listed = true;
		if(l->host == NULL || l->username == NULL || l->password == NULL) return "internal";
	}
	for(i = 0; i < n_links;){
		if(links[i]->listed){
			i++;
			continue;
		}
		link_free(links[i]);
		links[i] = links[--n_links];
	}
	return NULL;
}

const char *linkout_filters(const cJSON *req, const char **why)
{
	const cJSON *add = cJSON_GetObjectItemCaseSensitive(req, "add");
	const cJSON *remove = cJSON_GetObjectItemCaseSensitive(req, "remove"), *f;
	const char *peer = cjson_get_str(req, "peer");
	struct link *l = peer ? find(peer) : NULL;

	*why = NULL;
	if(peer == NULL || (add && !cJSON_IsArray(add)) || (remove && !cJSON_IsArray(remove))){
		*why = "peer, and add and remove as arrays of filters";
		return "bad_request";
	}
	if(l == NULL) return "unknown_peer";
	cJSON_ArrayForEach(f, add){
		if(!cJSON_IsString(f) || strncmp(f->valuestring, "$share/", 7) == 0
				|| mosquitto_sub_topic_check(f->valuestring) != MOSQ_ERR_SUCCESS){
			*why = "a filter is not a valid plain topic filter";
			return "bad_request";
		}
	}
	cJSON_ArrayForEach(f, remove){
		if(!cJSON_IsString(f)){
			*why = "a filter is not a string";
			return "bad_request";
		}
	}
	cJSON_ArrayForEach(f, add){
		if(!ftrie_add(&l->trie, f->valuestring)) return "internal";
	}
	cJSON_ArrayForEach(f, remove) ftrie_remove(&l->trie, f->valuestring);
	return NULL;
}

bool linkout_active(void)
{
	return n_links > 0;
}

/* ---- records and batches ------------------------------------------------------------------- */

static void put_u16(uint8_t *p, uint16_t v)
{
	p[0] = (uint8_t)(v >> 8);
	p[1] = (uint8_t)v;
}

static size_t varint_len(size_t v)
{
	return v < 128 ? 1 : v < 16384 ? 2 : v < 2097152 ? 3 : 4;
}

static size_t put_varint(uint8_t *p, size_t v)
{
	size_t n = 0;

	do{
		p[n] = (uint8_t)(v & 0x7F);
		v >>= 7;
		if(v) p[n] |= 0x80;
		n++;
	}while(v);
	return n;
}

/* Seal the first `max` records built so far (all: at most BATCH_RECORDS_MAX) into a PUBLISH
 * of one batch. */
static bool seal_some(struct link *l, uint32_t max)
{
	size_t topic_len = strlen(MQFED_INJECT_TOPIC), body, at, len = 0;
	uint32_t count = 0;
	struct batch *b;

	if(l->rec_count == 0) return true;
	while(count < max && count < l->rec_count){ /* each record: its u32 length, then it */
		len += mqfb_encoded_size(l->rec + len);
		count++;
	}
	body = 2 + topic_len + 2 + MQFB_HEADER_LEN + len;
	if(body > 268435455) return false;
	b = malloc(sizeof(*b) + 1 + varint_len(body) + body);
	if(b == NULL) return false;
	memset(b, 0, sizeof(*b));
	b->pkt[0] = 0x32; /* PUBLISH, QoS 1 */
	at = 1 + put_varint(b->pkt + 1, body);
	put_u16(b->pkt + at, (uint16_t)topic_len);
	memcpy(b->pkt + at + 2, MQFED_INJECT_TOPIC, topic_len);
	at += 2 + topic_len;
	b->mid_at = at;
	at += 2;
	b->id = ++l->batch_id;
	mqfb_put_header(b->pkt + at, (uint16_t)count, b->id);
	at += MQFB_HEADER_LEN;
	memcpy(b->pkt + at, l->rec, len);
	b->len = at + len;
	b->records = count;
	b->bytes = len;
	if(l->tail) l->tail->next = b;
	else l->head = b;
	l->tail = b;
	if(l->wr == NULL) l->wr = b;
	l->batches++;
	memmove(l->rec, l->rec + len, l->rec_len - len);
	l->rec_len -= len;
	l->rec_count -= count;
	return true;
}

static bool seal(struct link *l)
{
	return seal_some(l, BATCH_RECORDS_MAX);
}

/* Records per batch sealed at the TICK: small enough to pace by when the peer bounds its
 * subscribers' queues (a quarter of its bound), else as many as a batch takes. */
static uint32_t batch_records(const struct link *l)
{
	long limit = l->room.limit;

	if(limit <= 0 || l->room.lifted) return BATCH_RECORDS_MAX;
	return limit / 4 < 1 ? 1 : limit / 4 < BATCH_RECORDS_MAX ? (uint32_t)(limit / 4)
		: BATCH_RECORDS_MAX;
}

bool linkout_take(uint8_t qos, bool retain, const char *topic,
		const char *client, size_t client_len, const uint8_t *props, uint32_t props_len,
		const void *payload, uint32_t payload_len)
{
	struct link *to[LINKS_MAX];
	unsigned n = 0, i;
	size_t topic_len = strlen(topic), origin_len = strlen(node_id ? node_id : ""), size;
	struct link *l;
	uint8_t *grown;
	size_t cap;
	uint64_t seq, hlc;

	if(n_links == 0 || topic_len > UINT16_MAX || client_len > UINT16_MAX) return false;
	size = mqfb_record_size(topic_len, client_len, props_len, payload_len) + 2 + origin_len;
	for(i = 0; i < n_links; i++){
		if(!ftrie_matches(&links[i]->trie, topic)) continue;
		if(links[i]->held_bytes + size > LINK_BYTES_MAX){
			n_refused++;
			return false; /* the capture socket takes it for every peer */
		}
		to[n++] = links[i];
	}
	if(n == 0) return false;
	for(i = 0; i < n; i++){ /* room first: all of them or none */
		l = to[i];
		if(l->rec_count && (l->rec_len + size > BATCH_BYTES_MAX
					|| l->rec_count == BATCH_RECORDS_MAX) && !seal(l)){
			n_refused++;
			return false;
		}
		if(l->rec_len + size > l->rec_cap){
			cap = l->rec_cap ? l->rec_cap : 4096;
			while(cap < l->rec_len + size) cap *= 2;
			grown = realloc(l->rec, cap);
			if(grown == NULL){
				n_refused++;
				return false;
			}
			l->rec = grown;
			l->rec_cap = cap;
		}
	}
	seq = ++link_seq;
	hlc = hlc_next(&last_hlc);
	for(i = 0; i < n; i++){
		l = to[i];
		mqfb_put_origin_record(l->rec + l->rec_len, qos, retain, seq, hlc, topic, topic_len,
				client, client_len, node_id, origin_len, props, props_len, payload,
				payload_len);
		l->rec_len += size;
		l->rec_count++;
		l->held_bytes += size;
		l->records++;
	}
	return true;
}

/* ---- the connection ------------------------------------------------------------------------ */

static void warn(struct link *l, const char *what, int err)
{
	uint64_t held;

	if(!ratelog_due(&l->log, 10000, &held)) return;
	mosquitto_log_printf(MOSQ_LOG_WARNING, "mqfed: link to peer %s (%s:%d): %s%s%s "
			"(%llu more held back); it is tried again", l->peer, l->host, l->port, what,
			err ? ": " : "", err ? strerror(err) : "", (unsigned long long)held);
}

static void put_str(uint8_t *p, size_t *at, const char *s)
{
	size_t n = strlen(s);

	put_u16(p + *at, (uint16_t)n);
	memcpy(p + *at + 2, s, n);
	*at += 2 + n;
}

/* CONNECT (MQTT 3.1.1, clean session, username and password). */
static void queue_connect(struct link *l)
{
	size_t body = 10 + 2 + strlen(l->client_id) + 2 + strlen(l->username) + 2
		+ strlen(l->password);
	size_t at;

	l->ctl[0] = 0x10;
	at = 1 + put_varint(l->ctl + 1, body);
	memcpy(l->ctl + at, "\0\4MQTT\4", 7);
	l->ctl[at + 7] = 0xC2; /* username, password, clean session */
	put_u16(l->ctl + at + 8, KEEPALIVE_S);
	at += 10;
	put_str(l->ctl, &at, l->client_id);
	put_str(l->ctl, &at, l->username);
	put_str(l->ctl, &at, l->password);
	l->ctl_len = at;
	l->ctl_off = 0;
}

static void start_connect(struct link *l, int64_t now)
{
	int one = 1;

	l->fd = socket(l->addr.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	if(l->fd < 0){
		warn(l, "no socket", errno);
		link_close(l, true);
		return;
	}
	(void)setsockopt(l->fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
	l->started_ms = now;
	if(connect(l->fd, (struct sockaddr *)&l->addr, l->addr_len) == 0 || errno == EINPROGRESS){
		l->st = L_CONNECTING;
		return;
	}
	warn(l, "connect failed", errno);
	link_close(l, true);
}

/* A connect in progress: done, failed, or not yet. */
static void check_connected(struct link *l)
{
	struct pollfd p = {.fd = l->fd, .events = POLLOUT};
	int err = 0;
	socklen_t len = sizeof(err);

	if(poll(&p, 1, 0) <= 0) return;
	if(getsockopt(l->fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0) err = errno;
	if(err){
		warn(l, "connect failed", err);
		link_close(l, true);
		return;
	}
	queue_connect(l);
	l->st = L_CONNACK;
}

/* Write what can be written: the control packet, then batches in order within the window. */
static bool write_some(struct link *l, int64_t now)
{
	ssize_t n;
	struct batch *b;

	for(;;){
		if(l->ctl_off < l->ctl_len){
			n = send(l->fd, l->ctl + l->ctl_off, l->ctl_len - l->ctl_off,
					MSG_NOSIGNAL | MSG_DONTWAIT);
			if(n < 0) return errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR;
			l->ctl_off += (size_t)n;
			l->write_ms = now;
			if(l->ctl_off < l->ctl_len) return true;
			l->ctl_len = l->ctl_off = 0;
			continue;
		}
		if(l->st != L_UP || (b = l->wr) == NULL) return true;
		if(l->wr_off == 0){
			if(l->inflight >= WINDOW || l->ua_n == UNANSWERED_MAX) return true;
			if(room_left(&l->room) < (long)b->records){
				/* no room at the peer: wait for its replies; with none to wait for, one
				 * batch every ROOM_PROBE_MS measures again */
				if(l->ua_n > 0 || now - l->probe_ms < ROOM_PROBE_MS){
					l->paced++;
					return true;
				}
				l->probe_ms = now;
			}
			if(++l->next_mid == 0) l->next_mid = 1;
			b->mid = l->next_mid;
			put_u16(b->pkt + b->mid_at, b->mid);
			if(b->tried){
				b->pkt[0] |= 0x08; /* DUP */
				l->resent++;
			}
		}
		n = send(l->fd, b->pkt + l->wr_off, b->len - l->wr_off, MSG_NOSIGNAL | MSG_DONTWAIT);
		if(n < 0) return errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR;
		l->wr_off += (size_t)n;
		l->write_ms = now;
		if(l->wr_off < b->len) return true;
		b->sent = true;
		l->inflight++;
		room_sent(&l->room, b->records);
		l->ua[(l->ua_head + l->ua_n++) % UNANSWERED_MAX] = (struct unanswered){
			.id = b->id, .records = b->records, .at_ms = now};
		l->wr = b->next;
		l->wr_off = 0;
	}
}

/* A PUBACK: its batch is in the peer's Mosquitto. */
static bool puback(struct link *l, uint16_t mid)
{
	struct batch **pp, *b;

	for(pp = &l->head; (b = *pp) != NULL && b->sent; pp = &b->next){
		if(b->mid != mid) continue;
		*pp = b->next;
		if(l->tail == b){
			l->tail = NULL;
			for(l->tail = l->head; l->tail && l->tail->next; l->tail = l->tail->next){}
		}
		l->held_bytes -= b->bytes;
		l->inflight--;
		l->acked++;
		l->acked_records += b->records;
		free(b);
		return true;
	}
	return false;
}

/* The oldest unanswered batch has its answer (`queued` < 0: no measure). */
static void answered(struct link *l, long queued, long limit, int64_t now)
{
	struct unanswered *u = &l->ua[l->ua_head];

	if(room_answered(&l->room, u->records, queued, limit, now)){
		l->lifted++;
		mosquitto_log_printf(MOSQ_LOG_WARNING, "mqfed: link to peer %s: a subscriber there "
				"has not read for %d s; its queue is no longer waited for (it loses what "
				"overflows, as on one broker)", l->peer, ROOM_GIVE_UP_MS / 1000);
	}
	l->ua_head = (l->ua_head + 1) % UNANSWERED_MAX;
	l->ua_n--;
}

static long json_long(const cJSON *o, const char *key, long dflt)
{
	const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);

	return cJSON_IsNumber(v) ? (long)v->valuedouble : dflt;
}

/* An inject reply from the peer's plugin (inject.c): {"batch", "ok", "queued", "bound"}. */
static void on_reply(struct link *l, const uint8_t *payload, size_t len, int64_t now)
{
	cJSON *o = cJSON_ParseWithLength((const char *)payload, len);
	const cJSON *ok = cJSON_GetObjectItemCaseSensitive(o, "ok");
	long id = json_long(o, "batch", -1);
	bool measured = cJSON_IsTrue(ok);

	while(o && id >= 0 && l->ua_n > 0 && l->ua[l->ua_head].id <= (uint64_t)id){
		if(l->ua[l->ua_head].id == (uint64_t)id){
			answered(l, measured ? json_long(o, "queued", -1) : -1,
					json_long(o, "bound", -1), now);
			break;
		}
		answered(l, -1, -1, now); /* an earlier batch whose reply was lost */
	}
	cJSON_Delete(o);
}

/* One packet from the peer; false: close the connection. */
static bool on_packet(struct link *l, uint8_t type, const uint8_t *body, size_t n, int64_t now)
{
	size_t topic_len;

	if(type == 0x20 && n == 2 && l->st == L_CONNACK){
		if(body[1] != 0){
			warn(l, body[1] == 4 || body[1] == 5 ? "refused: bad credentials (check the peer "
					"token)" : "refused by the peer", 0);
			return false;
		}
		l->st = L_UP;
		l->connects++;
		l->backoff = 0;
		l->log.logged = false;
		return true;
	}
	if(type == 0x40 && n == 2 && l->st == L_UP){
		if(puback(l, (uint16_t)(body[0] << 8 | body[1]))) return true;
		warn(l, "a PUBACK for no batch", 0);
		return false;
	}
	if(type == 0xD0 && n == 0) return true;
	if((type & 0xF6) == 0x30 && n >= 2 && l->st == L_UP){ /* PUBLISH, QoS 0 */
		topic_len = (size_t)body[0] << 8 | body[1];
		if(topic_len <= n - 2 && topic_len == strlen(MQFED_INJECT_REPLY)
				&& memcmp(body + 2, MQFED_INJECT_REPLY, topic_len) == 0){
			on_reply(l, body + 2 + topic_len, n - 2 - topic_len, now);
		}
		return true;
	}
	warn(l, "unexpected packet from the peer", 0);
	return false;
}

/* Read and handle what the peer sent. False: close it. */
static bool read_some(struct link *l, int64_t now)
{
	ssize_t got;
	size_t at, len, hdr;
	uint32_t mult;
	int i;

	for(;;){
		got = recv(l->fd, l->in + l->in_len, IN_MAX - l->in_len, MSG_DONTWAIT);
		if(got == 0){
			warn(l, "the peer closed the connection", 0);
			return false;
		}
		if(got < 0){
			if(errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) return true;
			warn(l, "read failed", errno);
			return false;
		}
		l->in_len += (size_t)got;
		l->read_ms = now;
		at = 0;
		for(;;){ /* complete packets: a type byte, a variable length, the body */
			len = 0;
			mult = 1;
			for(i = 1; i <= 4 && at + (size_t)i < l->in_len; i++){
				len += (size_t)(l->in[at + (size_t)i] & 0x7F) * mult;
				mult *= 128;
				if(!(l->in[at + (size_t)i] & 0x80)) break;
			}
			if(i > 4){
				warn(l, "malformed packet from the peer", 0);
				return false;
			}
			if(at + (size_t)i >= l->in_len) break; /* the length is not all in */
			hdr = 1 + (size_t)i;
			if(hdr + len > IN_MAX){
				warn(l, "a packet too large from the peer", 0);
				return false;
			}
			if(l->in_len - at < hdr + len) break;
			if(!on_packet(l, l->in[at], l->in + at + hdr, len, now)) return false;
			at += hdr + len;
		}
		memmove(l->in, l->in + at, l->in_len - at);
		l->in_len -= at;
	}
}

static void link_tick(struct link *l, int64_t now)
{
	while(l->rec_count){
		if(!seal_some(l, batch_records(l))){
			warn(l, "out of memory sealing a batch", 0);
			break;
		}
	}
	while(l->ua_n > 0 && now - l->ua[l->ua_head].at_ms > REPLY_WAIT_MS) answered(l, -1, -1, now);
	if(l->st == L_DOWN){
		if(now < l->retry_at) return;
		start_connect(l, now);
		if(l->st == L_DOWN) return;
	}
	if(l->st == L_CONNECTING){
		check_connected(l);
		if(l->st == L_CONNECTING && now - l->started_ms > CONNECT_TIMEOUT_MS){
			warn(l, "connect timed out", 0);
			link_close(l, true);
		}
		if(l->st != L_CONNACK) return;
		l->read_ms = now;
	}
	if(!read_some(l, now)){
		link_close(l, true);
		return;
	}
	if(l->st == L_CONNACK && now - l->started_ms > CONNECT_TIMEOUT_MS){
		warn(l, "no CONNACK", 0);
		link_close(l, true);
		return;
	}
	if(l->st == L_UP && l->ctl_len == 0 && l->wr_off == 0 && now - l->write_ms >= PING_AFTER_MS){
		l->ctl[0] = 0xC0;
		l->ctl[1] = 0;
		l->ctl_len = 2;
		l->ctl_off = 0;
	}
	if(l->st == L_UP && now - l->read_ms > DEAD_AFTER_MS){
		warn(l, "the peer stopped answering", 0);
		link_close(l, true);
		return;
	}
	if(!write_some(l, now)){
		warn(l, "write failed", errno);
		link_close(l, true);
	}
}

void linkout_tick(void)
{
	int64_t now;
	unsigned i;

	if(n_links == 0) return;
	now = mono_ms();
	for(i = 0; i < n_links; i++) link_tick(links[i], now);
}

void linkout_stats(struct linkout_stats *s)
{
	unsigned i;
	struct link *l;

	memset(s, 0, sizeof(*s));
	s->links = n_links;
	s->refused = n_refused;
	s->abandoned = n_abandoned;
	for(i = 0; i < n_links; i++){
		l = links[i];
		s->up += l->st == L_UP;
		s->records += l->records;
		s->batches += l->batches;
		s->acked += l->acked;
		s->resent += l->resent;
		s->connects += l->connects;
		s->failures += l->failures;
		s->held_bytes += l->held_bytes;
	}
}

cJSON *linkout_links_json(void)
{
	static const char *names[] = {"down", "connecting", "connack", "up"};
	cJSON *arr = cJSON_CreateArray(), *o;
	unsigned i;
	struct link *l;

	if(arr == NULL) return NULL;
	for(i = 0; i < n_links; i++){
		l = links[i];
		o = cJSON_CreateObject();
		if(o == NULL) break;
		cJSON_AddStringToObject(o, "peer", l->peer);
		cJSON_AddStringToObject(o, "state", names[l->st]);
		cJSON_AddNumberToObject(o, "filters", (double)l->trie.filters);
		cJSON_AddNumberToObject(o, "records", (double)l->records);
		cJSON_AddNumberToObject(o, "batches", (double)l->batches);
		cJSON_AddNumberToObject(o, "acked", (double)l->acked);
		cJSON_AddNumberToObject(o, "acked_records", (double)l->acked_records);
		cJSON_AddNumberToObject(o, "resent", (double)l->resent);
		cJSON_AddNumberToObject(o, "inflight", l->inflight);
		cJSON_AddNumberToObject(o, "held_bytes", (double)l->held_bytes);
		cJSON_AddNumberToObject(o, "connects", (double)l->connects);
		cJSON_AddNumberToObject(o, "failures", (double)l->failures);
		cJSON_AddNumberToObject(o, "paced", (double)l->paced);
		cJSON_AddNumberToObject(o, "lifted", (double)l->lifted);
		cJSON_AddNumberToObject(o, "bound", (double)l->room.limit);
		cJSON_AddNumberToObject(o, "peer_queued", (double)l->room.queued);
		cJSON_AddItemToArray(arr, o);
	}
	return arr;
}

void linkout_cleanup(void)
{
	unsigned i;

	for(i = 0; i < n_links; i++) link_free(links[i]);
	n_links = 0;
	free(node_id);
	node_id = NULL;
	n_refused = n_abandoned = link_seq = last_hlc = 0;
}
