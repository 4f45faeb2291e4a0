/*
 * The capture buffer (capture.c makes the records): MQFB records held in memory, in seq order,
 * until the sidecar acknowledges them, and the unix socket they go through
 * (docs/plugin-protocol.md, "Capture socket").
 *
 * The socket is written and read at the loop's TICK only (and written at once past 64 KiB of
 * unsent records), non-blocking: the plugin connects (at most once per second while that
 * fails), writes its hello, waits for the sidecar's resume, then sends every unacknowledged
 * record after the resume point in seq order as batches; acks free records. Anything
 * malformed from the sidecar closes the connection; the records are sent again on the next.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "batch.h"
#include "capbuf.h"
#include "shed.h"

#define RETRY_MS 1000              /* between connection attempts */
#define WRITE_NOW_BYTES (64u << 10) /* unsent records: write before the TICK */
#define OUT_MAX (1u << 20)         /* bytes framed ahead of the socket */
#define BATCH_BYTES (256u << 10)   /* a batch is closed past this */
#define IN_MAX (MQFA_HEADER_LEN + 8u * 65535u)
#define READS_PER_TICK 16
#define LOG_MS 10000

/* One record, encoded (its u32 length first). */
struct crec {
	uint64_t seq;
	uint32_t size;
	uint8_t data[];
};

enum { SOCK_DOWN, SOCK_AWAIT_RESUME, SOCK_READY };

static char *path;
static uint64_t epoch;

static struct crec **ring;         /* unacknowledged records by seq: ring[(head + i) % cap] */
static size_t ring_cap, ring_head, ring_n;
static uint64_t first_seq = 1;     /* seq of the ring's first slot */
static uint64_t next_seq = 1;
static uint64_t send_seq = 1;      /* the next record to frame on this connection */
static uint64_t unsent_bytes;
static uint64_t last_hlc;

static int fd = -1;
static int sock_state = SOCK_DOWN;
static int64_t last_try_ms;
static bool tried;
static uint8_t *out;
static size_t out_len, out_off, out_cap;
static uint8_t *in;
static size_t in_len;

static struct capbuf_stats st;
static struct ratelog connect_log;

int capbuf_init(const char *socket_path, uint64_t plugin_epoch)
{
	if(strlen(socket_path) >= sizeof(((struct sockaddr_un *)0)->sun_path)){
		mosquitto_log_printf(MOSQ_LOG_ERR, "mqfed: plugin_opt_capture_socket '%s' is longer "
				"than a unix socket path may be", socket_path);
		return -1;
	}
	path = strdup(socket_path);
	in = malloc(IN_MAX);
	if(path == NULL || in == NULL) return -1;
	epoch = plugin_epoch ? plugin_epoch : 1;
	return 0;
}

/* ---- records ------------------------------------------------------------------------------ */

static struct crec **slot(uint64_t seq)
{
	return &ring[(ring_head + (size_t)(seq - first_seq)) % ring_cap];
}

static bool ring_push(struct crec *r)
{
	struct crec **grown;
	size_t cap, i;

	if(ring_n == ring_cap){
		cap = ring_cap ? ring_cap * 2 : 1024;
		grown = malloc(cap * sizeof(*grown));
		if(grown == NULL) return false;
		for(i = 0; i < ring_n; i++) grown[i] = ring[(ring_head + i) % ring_cap];
		free(ring);
		ring = grown;
		ring_cap = cap;
		ring_head = 0;
	}
	ring[(ring_head + ring_n) % ring_cap] = r;
	ring_n++;
	return true;
}

static void record_settled(struct crec *r)
{
	st.buffered--;
	st.buffered_bytes -= r->size;
	st.acked++;
	if(r->seq >= send_seq && unsent_bytes >= r->size) unsent_bytes -= r->size;
	free(r);
}

/* Drop settled slots from the front. */
static void ring_trim(void)
{
	while(ring_n > 0 && ring[ring_head] == NULL){
		ring_head = (ring_head + 1) % ring_cap;
		ring_n--;
		first_seq++;
	}
	if(ring_n == 0) first_seq = next_seq;
}

static void settle_upto(uint64_t seq)
{
	struct crec *r;

	while(ring_n > 0 && first_seq <= seq){
		r = ring[ring_head];
		if(r) record_settled(r);
		ring[ring_head] = NULL;
		ring_head = (ring_head + 1) % ring_cap;
		ring_n--;
		first_seq++;
	}
	ring_trim();
}

static void settle_one(uint64_t seq)
{
	struct crec **s;

	if(seq < first_seq || seq - first_seq >= ring_n) return;
	s = slot(seq);
	if(*s){
		record_settled(*s);
		*s = NULL;
	}
	ring_trim();
}

static void flush(void);

/* Append one record of `kind` (the next seq, the hlc now); false when out of memory. */
bool capbuf_append(uint8_t kind, uint8_t qos, bool retain, const char *topic, size_t topic_len,
		const char *client, size_t client_len, const uint8_t *props, uint32_t props_len,
		const void *payload, uint32_t payload_len)
{
	size_t size = mqfb_record_size(topic_len, client_len, props_len, payload_len);
	struct crec *r;

	if(topic_len > UINT16_MAX || client_len > UINT16_MAX || size - 4 > UINT32_MAX) return false;
	r = malloc(sizeof(*r) + size);
	if(r == NULL) return false;
	r->seq = next_seq;
	r->size = (uint32_t)size;
	mqfb_put_record(r->data, kind, qos, retain, r->seq, hlc_next(&last_hlc), topic, topic_len,
			client, client_len, props, props_len, payload, payload_len);
	if(!ring_push(r)){
		free(r);
		return false;
	}
	if(ring_n == 1) first_seq = r->seq;
	next_seq++;
	st.records++;
	st.buffered++;
	st.buffered_bytes += size;
	unsent_bytes += size;
	shed_capture_held(st.buffered);
	if(sock_state == SOCK_READY && unsent_bytes >= WRITE_NOW_BYTES) flush();
	return true;
}

/* Bytes of the records not acknowledged yet. */
uint64_t capbuf_bytes(void)
{
	return st.buffered_bytes;
}

/* ---- the socket --------------------------------------------------------------------------- */

static void sock_close(void)
{
	if(fd >= 0) close(fd);
	fd = -1;
	sock_state = SOCK_DOWN;
	out_len = out_off = 0;
	in_len = 0;
	last_try_ms = mono_ms();
}

static bool out_reserve(size_t more)
{
	uint8_t *grown;
	size_t cap;

	if(out_off > 0){
		memmove(out, out + out_off, out_len - out_off);
		out_len -= out_off;
		out_off = 0;
	}
	if(out_len + more <= out_cap) return true;
	cap = (out_len + more) * 2;
	grown = realloc(out, cap);
	if(grown == NULL) return false;
	out = grown;
	out_cap = cap;
	return true;
}

/* A connection to the sidecar is up (try_connect; the fuzz target hands in a socketpair). */
void capbuf_attach(int s)
{
	if(fd >= 0) close(fd);
	fd = s;
	sock_state = SOCK_AWAIT_RESUME;
	out_len = out_off = 0;
	in_len = 0;
	st.connects++;
	if(!out_reserve(MQFH_LEN)){
		sock_close();
		return;
	}
	mqfh_put(out, epoch, next_seq);
	out_len = MQFH_LEN;
	mosquitto_log_printf(MOSQ_LOG_NOTICE, "mqfed: capture socket %s connected (%llu records "
			"unacknowledged)", path, (unsigned long long)st.buffered);
}

static void try_connect(void)
{
	struct sockaddr_un addr;
	int64_t now = mono_ms();
	uint64_t held;
	int s;

	if(fd >= 0 || (tried && now - last_try_ms < RETRY_MS)) return;
	tried = true;
	last_try_ms = now;
	memset(&addr, 0, sizeof(addr));
	addr.sun_family = AF_UNIX;
	memcpy(addr.sun_path, path, strlen(path) + 1);
	s = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	if(s >= 0 && connect(s, (struct sockaddr *)&addr, sizeof(addr)) == 0){
		capbuf_attach(s);
		return;
	}
	if(ratelog_due(&connect_log, LOG_MS, &held)){
		mosquitto_log_printf(MOSQ_LOG_WARNING, "mqfed: cannot connect to the capture socket "
				"%s: %s (retrying every second; %llu records held)", path, strerror(errno),
				(unsigned long long)st.buffered);
	}
	if(s >= 0) close(s);
}

static void malformed(const char *why)
{
	st.malformed++;
	mosquitto_log_printf(MOSQ_LOG_ERR, "mqfed: capture socket %s: malformed message from the "
			"sidecar (%s); closing the connection (its %llu unacknowledged records are sent "
			"again on the next one)", path, why, (unsigned long long)st.buffered);
	sock_close();
}

/* Apply one message of the sidecar; false when it is malformed (the connection is closed). */
static bool apply(const struct mqfa_msg *m)
{
	uint64_t s;
	uint16_t i;

	if(m->kind == MQFA_KIND_RESUME && sock_state != SOCK_AWAIT_RESUME){
		malformed("a second resume");
		return false;
	}
	if(m->kind == MQFA_KIND_ACK && sock_state != SOCK_READY){
		malformed("an ack before the resume");
		return false;
	}
	if(m->seq >= next_seq){
		malformed("a seq not sent yet");
		return false;
	}
	for(i = 0; i < m->count; i++){
		s = mqfa_listed(m, i);
		if(s <= m->seq || s >= next_seq){
			malformed("a listed seq out of range");
			return false;
		}
	}
	settle_upto(m->seq);
	for(i = 0; i < m->count; i++) settle_one(mqfa_listed(m, i));
	shed_capture_held(st.buffered);
	if(m->kind == MQFA_KIND_RESUME){
		sock_state = SOCK_READY;
		send_seq = m->seq + 1 > first_seq ? m->seq + 1 : first_seq;
		unsent_bytes = 0;
		for(s = send_seq; s < next_seq; s++){
			struct crec *r = *slot(s);
			if(r) unsent_bytes += r->size;
		}
	}
	return true;
}

/* Bytes read from the socket (or, for the fuzz target, handed in). */
void capbuf_feed(const uint8_t *buf, size_t len)
{
	struct mqfa_msg m;
	size_t take, used, off;
	const char *why;
	int rc;

	while(len > 0 && fd >= 0){
		take = IN_MAX - in_len < len ? IN_MAX - in_len : len;
		memcpy(in + in_len, buf, take);
		in_len += take;
		buf += take;
		len -= take;
		off = 0;
		while(fd >= 0 && (rc = mqfa_parse(in + off, in_len - off, &m, &used, &why)) != 0){
			if(rc < 0){
				malformed(why);
				return;
			}
			if(!apply(&m)) return;
			off += used;
		}
		if(fd < 0) return;
		memmove(in, in + off, in_len - off);
		in_len -= off;
	}
}

static void read_acks(void)
{
	uint8_t buf[16384];
	ssize_t n;
	int k;

	for(k = 0; k < READS_PER_TICK && fd >= 0; k++){
		n = read(fd, buf, sizeof(buf));
		if(n > 0){
			capbuf_feed(buf, (size_t)n);
			continue;
		}
		if(n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return;
		mosquitto_log_printf(MOSQ_LOG_WARNING, "mqfed: capture socket %s: %s; reconnecting "
				"(%llu records unacknowledged)", path, n == 0 ? "closed by the sidecar"
				: strerror(errno), (unsigned long long)st.buffered);
		sock_close();
	}
}

/* Frame the records not sent on this connection into batches, up to OUT_MAX bytes ahead. */
static void frame(void)
{
	size_t at, count, bytes;
	uint64_t first;
	struct crec *r;

	while(send_seq < next_seq && out_len - out_off < OUT_MAX){
		if(!out_reserve(MQFB_HEADER_LEN)) return;
		at = out_len;
		out_len += MQFB_HEADER_LEN;
		count = bytes = 0;
		first = 0;
		while(send_seq < next_seq && count < 65535 && bytes < BATCH_BYTES){
			r = *slot(send_seq);
			if(r){
				if(!out_reserve(r->size)) break; /* what was framed goes; the rest later */
				memcpy(out + out_len, r->data, r->size);
				out_len += r->size;
				bytes += r->size;
				if(count++ == 0) first = r->seq;
				unsent_bytes = unsent_bytes >= r->size ? unsent_bytes - r->size : 0;
			}
			send_seq++;
		}
		if(count == 0){
			out_len = at;
			if(send_seq < next_seq) return; /* out of memory: again at the next TICK */
			break;
		}
		/* (`at` still holds: the first out_reserve above left out_off at 0) */
		mqfb_put_header(out + at, (uint16_t)count, first);
	}
}

static void flush(void)
{
	ssize_t n;

	if(fd < 0) return;
	if(sock_state == SOCK_READY) frame();
	if(out_len == out_off) return;
	n = send(fd, out + out_off, out_len - out_off, MSG_NOSIGNAL | MSG_DONTWAIT);
	if(n > 0){
		out_off += (size_t)n;
		st.sent_bytes += (uint64_t)n;
		if(out_off == out_len) out_off = out_len = 0;
		return;
	}
	if(n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return;
	mosquitto_log_printf(MOSQ_LOG_WARNING, "mqfed: capture socket %s: writing failed: %s; "
			"reconnecting (%llu records unacknowledged)", path, strerror(errno),
			(unsigned long long)st.buffered);
	sock_close();
}

/* The end of a loop iteration: connect if needed, read acks, write what is to go. */
void capbuf_tick(void)
{
	if(path == NULL) return;
	try_connect();
	if(fd >= 0) read_acks();
	flush();
}

void capbuf_stats(struct capbuf_stats *s)
{
	*s = st;
	s->connected = sock_state == SOCK_READY;
	s->next_seq = next_seq;
}

void capbuf_cleanup(void)
{
	size_t i;

	if(fd >= 0) close(fd);
	fd = -1;
	for(i = 0; i < ring_n; i++) free(ring[(ring_head + i) % ring_cap]);
	free(ring);
	ring = NULL;
	ring_cap = ring_head = ring_n = 0;
	first_seq = next_seq = send_seq = 1;
	unsent_bytes = last_hlc = 0;
	free(out);
	free(in);
	free(path);
	out = in = NULL;
	path = NULL;
	out_len = out_off = out_cap = in_len = 0;
	sock_state = SOCK_DOWN;
	last_try_ms = 0;
	tried = false;
	epoch = 0;
	memset(&st, 0, sizeof(st));
	memset(&connect_log, 0, sizeof(connect_log));
}
