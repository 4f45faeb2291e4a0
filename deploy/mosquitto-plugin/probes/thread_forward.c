/* Probe, not part of the product (issue 25, slice 3 feasibility): can a data plane live
 * inside the plugin, and what does a hop cost it against a plain Mosquitto bridge?
 *
 * Every client PUBLISH whose topic matches `plugin_opt_probe_filter` is copied at the
 * MESSAGE callback into a list; at the loop's TICK (right after Mosquitto handled its
 * sockets) the plugin wakes its own thread through a pipe; the thread sends the list as MQTT
 * 3.1.1 PUBLISH packets (QoS 0 or 1 as published; QoS 2 as 1), all in one write, on one
 * connection it holds to `plugin_opt_probe_host`:`plugin_opt_probe_port`, and reads the
 * PUBACKs. Mosquitto's thread never blocks on the peer. No resend, no reconnect: a probe.
 *
 * Measured by `python -m tests.system.plugin.bench_thread_forward` (docs/performance.md §14,
 * "Slice 3 probe"). Built by `make probes`; valgrind: that script's `--valgrind`. */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <mosquitto.h>
#include <mosquitto_broker.h>
#include <mosquitto_plugin.h>

#define EXPORT __attribute__((visibility("default")))

struct msg {
	struct msg *next;
	char *topic;
	void *payload;
	uint32_t len;
	uint8_t qos;
};

static mosquitto_plugin_id_t *plugin_id;
static char *filter, *host;
static int port;
static pthread_t thread;
static bool thread_started;
static int wake_pipe[2] = {-1, -1};
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static struct msg *head, *tail;     /* under lock */
static bool signal_due;             /* Mosquitto's thread only */
static atomic_bool stopping;
static bool tick_mode;              /* plugin_opt_probe_mode tick: no thread, sent at TICK */
static int tick_fd = -1;            /* tick mode: the connection, non-blocking once up */
static struct buf_pending { uint8_t *data; size_t len, cap; } tick_out;
static uint8_t tick_in[4096];
static size_t tick_have;
static uint16_t tick_mid;
static atomic_ulong n_copied, n_sent, n_acked;

static void free_list(struct msg *m)
{
	while(m){
		struct msg *next = m->next;
		free(m->topic);
		free(m->payload);
		free(m);
		m = next;
	}
}

static int on_message(int event, void *event_data, void *userdata)
{
	struct mosquitto_evt_message *ed = event_data;
	struct msg *m;
	bool match = false;

	(void)event;
	(void)userdata;
	if(ed->topic == NULL || mosquitto_topic_matches_sub(filter, ed->topic, &match) != 0 || !match){
		return MOSQ_ERR_SUCCESS;
	}
	m = calloc(1, sizeof(*m));
	if(m == NULL) return MOSQ_ERR_SUCCESS;
	m->topic = strdup(ed->topic);
	m->payload = malloc(ed->payloadlen ? ed->payloadlen : 1);
	if(m->topic == NULL || m->payload == NULL){
		free_list(m);
		return MOSQ_ERR_SUCCESS;
	}
	if(ed->payloadlen) memcpy(m->payload, ed->payload, ed->payloadlen);
	m->len = ed->payloadlen;
	m->qos = ed->qos ? 1 : 0;
	pthread_mutex_lock(&lock);
	if(tail) tail->next = m;
	else head = m;
	tail = m;
	pthread_mutex_unlock(&lock);
	atomic_fetch_add(&n_copied, 1);
	signal_due = true;
	return MOSQ_ERR_SUCCESS;
}

static void tick_send(void);

static int on_tick(int event, void *event_data, void *userdata)
{
	(void)event;
	(void)event_data;
	(void)userdata;
	if(tick_mode){
		tick_send();
		return MOSQ_ERR_SUCCESS;
	}
	if(signal_due){
		signal_due = false;
		if(write(wake_pipe[1], "w", 1) < 0 && errno != EAGAIN){
			mosquitto_log_printf(MOSQ_LOG_WARNING, "probe: wake write failed: %s", strerror(errno));
		}
	}
	return MOSQ_ERR_SUCCESS;
}

/* ---- the thread's MQTT client ---------------------------------------------------------- */

struct buf {
	uint8_t *data;
	size_t len, cap;
};

static bool buf_put(struct buf *b, const void *data, size_t n)
{
	if(b->len + n > b->cap){
		size_t cap = b->cap ? b->cap : 4096;
		uint8_t *grown;
		while(cap < b->len + n) cap *= 2;
		grown = realloc(b->data, cap);
		if(grown == NULL) return false;
		b->data = grown;
		b->cap = cap;
	}
	memcpy(b->data + b->len, data, n);
	b->len += n;
	return true;
}

static bool put_varint(struct buf *b, uint32_t v)
{
	uint8_t out[4];
	int n = 0;
	do{
		out[n] = (uint8_t)(v & 0x7F);
		v >>= 7;
		if(v) out[n] |= 0x80;
		n++;
	}while(v && n < 4);
	return buf_put(b, out, (size_t)n);
}

static bool put_u16(struct buf *b, uint16_t v)
{
	uint8_t out[2] = {(uint8_t)(v >> 8), (uint8_t)v};
	return buf_put(b, out, 2);
}

static bool write_all(int fd, const uint8_t *data, size_t n)
{
	while(n){
		ssize_t w = write(fd, data, n);
		if(w < 0){
			if(errno == EINTR) continue;
			return false;
		}
		data += w;
		n -= (size_t)w;
	}
	return true;
}

static int dial(void)
{
	struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
	struct buf b = {0};
	static const char proto[] = {0, 4, 'M', 'Q', 'T', 'T', 4, 0x02, 0, 0};
	char id[64];
	uint8_t ack[4];
	int fd, one = 1;
	size_t got = 0;

	if(inet_pton(AF_INET, host, &sa.sin_addr) != 1) return -1;
	fd = socket(AF_INET, SOCK_STREAM, 0);
	if(fd < 0) return -1;
	if(connect(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0){
		close(fd);
		return -1;
	}
	setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
	snprintf(id, sizeof(id), "probe-fwd-%d", (int)getpid());
	buf_put(&b, "\x10", 1);
	put_varint(&b, (uint32_t)(sizeof(proto) + 2 + strlen(id)));
	buf_put(&b, proto, sizeof(proto));
	put_u16(&b, (uint16_t)strlen(id));
	buf_put(&b, id, strlen(id));
	if(b.data == NULL || !write_all(fd, b.data, b.len)){
		free(b.data);
		close(fd);
		return -1;
	}
	free(b.data);
	while(got < sizeof(ack)){
		ssize_t r = read(fd, ack + got, sizeof(ack) - got);
		if(r <= 0){
			close(fd);
			return -1;
		}
		got += (size_t)r;
	}
	if(ack[0] != 0x20 || ack[3] != 0){
		close(fd);
		return -1;
	}
	return fd;
}

/* PUBACKs (and anything else the peer sends) are counted and dropped */
static void read_acks(int fd, uint8_t *in, size_t *have)
{
	ssize_t r = read(fd, in + *have, 4096 - *have);
	size_t pos = 0;

	if(r <= 0) return;
	*have += (size_t)r;
	while(*have - pos >= 2){
		uint32_t len = 0, mult = 1;
		size_t p = pos + 1;
		while(p < *have && (in[p] & 0x80) && mult < 128 * 128 * 128){
			len += (uint32_t)(in[p] & 0x7F) * mult;
			mult *= 128;
			p++;
		}
		if(p >= *have) break;
		len += (uint32_t)(in[p] & 0x7F) * mult;
		p++;
		if(len > 4096 || p + len > *have) break;
		if((in[pos] & 0xF0) == 0x40) atomic_fetch_add(&n_acked, 1);
		pos = p + len;
	}
	memmove(in, in + pos, *have - pos);
	*have -= pos;
}

/* the PUBLISH packets of `list` appended to `out` (the list freed) */
static void encode_list(struct msg *list, struct buf *out, uint16_t *mid)
{
	struct msg *m;

	for(m = list; m; m = m->next){
		size_t tlen = strlen(m->topic);
		buf_put(out, m->qos ? "\x32" : "\x30", 1);
		put_varint(out, (uint32_t)(2 + tlen + (m->qos ? 2 : 0) + m->len));
		put_u16(out, (uint16_t)tlen);
		buf_put(out, m->topic, tlen);
		if(m->qos){
			if(++*mid == 0) *mid = 1;
			put_u16(out, *mid);
		}
		buf_put(out, m->payload, m->len);
		atomic_fetch_add(&n_sent, 1);
	}
	free_list(list);
}

/* tick mode: Mosquitto's own thread writes what it can without blocking, keeps the rest for
 * the next TICK, and reads the PUBACKs there (they only count) */
static void tick_send(void)
{
	struct buf out = {tick_out.data, tick_out.len, tick_out.cap};
	struct msg *list;

	if(tick_fd < 0){
		tick_fd = dial();   /* (blocking once, at the first TICK: a probe) */
		if(tick_fd < 0) return;
		fcntl(tick_fd, F_SETFL, fcntl(tick_fd, F_GETFL) | O_NONBLOCK);
	}
	read_acks(tick_fd, tick_in, &tick_have);
	list = head;
	head = tail = NULL;
	encode_list(list, &out, &tick_mid);
	while(out.len){
		ssize_t w = write(tick_fd, out.data, out.len);
		if(w <= 0) break;   /* EAGAIN: the rest at the next TICK */
		memmove(out.data, out.data + w, out.len - (size_t)w);
		out.len -= (size_t)w;
	}
	tick_out.data = out.data;
	tick_out.len = out.len;
	tick_out.cap = out.cap;
}

static void *run(void *arg)
{
	struct buf out = {0};
	uint8_t in[4096], drain[64];
	size_t have = 0;
	uint16_t mid = 0;
	int fd = -1;

	(void)arg;
	while(!atomic_load(&stopping) && fd < 0){
		fd = dial();
		if(fd < 0) usleep(100000);
	}
	while(!atomic_load(&stopping) && fd >= 0){
		struct pollfd p[2] = {{.fd = wake_pipe[0], .events = POLLIN}, {.fd = fd, .events = POLLIN}};
		struct msg *list;

		if(poll(p, 2, -1) < 0 && errno != EINTR) break;
		if(p[1].revents) read_acks(fd, in, &have);
		if(!(p[0].revents & POLLIN)) continue;
		while(read(wake_pipe[0], drain, sizeof(drain)) == (ssize_t)sizeof(drain)){}
		pthread_mutex_lock(&lock);
		list = head;
		head = tail = NULL;
		pthread_mutex_unlock(&lock);
		out.len = 0;
		encode_list(list, &out, &mid);
		if(out.len && !write_all(fd, out.data, out.len)) break;
	}
	free(out.data);
	if(fd >= 0) close(fd);
	return NULL;
}

/* ---- entry points ---------------------------------------------------------------------- */

EXPORT int mosquitto_plugin_version(int count, const int *versions)
{
	for(int i = 0; i < count; i++){
		if(versions[i] == 5) return 5;
	}
	return -1;
}

EXPORT int mosquitto_plugin_init(mosquitto_plugin_id_t *identifier, void **userdata,
		struct mosquitto_opt *options, int option_count)
{
	(void)userdata;
	plugin_id = identifier;
	for(int i = 0; i < option_count; i++){
		if(!strcmp(options[i].key, "probe_filter")) filter = strdup(options[i].value);
		else if(!strcmp(options[i].key, "probe_host")) host = strdup(options[i].value);
		else if(!strcmp(options[i].key, "probe_port")) port = atoi(options[i].value);
		else if(!strcmp(options[i].key, "probe_mode")) tick_mode = !strcmp(options[i].value, "tick");
	}
	if(filter == NULL || host == NULL || port <= 0 || port > 65535){
		mosquitto_log_printf(MOSQ_LOG_ERR, "probe: needs plugin_opt_probe_filter, _host, _port");
		return MOSQ_ERR_INVAL;
	}
	if(pipe(wake_pipe) != 0) return MOSQ_ERR_UNKNOWN;
	for(int i = 0; i < 2; i++){
		int fl = fcntl(wake_pipe[i], F_GETFL);
		fcntl(wake_pipe[i], F_SETFL, fl | O_NONBLOCK);
	}
	atomic_store(&stopping, false);
	if(!tick_mode){
		if(pthread_create(&thread, NULL, run, NULL) != 0) return MOSQ_ERR_UNKNOWN;
		thread_started = true;
	}
	mosquitto_callback_register(plugin_id, MOSQ_EVT_MESSAGE, on_message, NULL, NULL);
	mosquitto_callback_register(plugin_id, MOSQ_EVT_TICK, on_tick, NULL, NULL);
	return MOSQ_ERR_SUCCESS;
}

EXPORT int mosquitto_plugin_cleanup(void *userdata, struct mosquitto_opt *options, int option_count)
{
	(void)userdata;
	(void)options;
	(void)option_count;
	mosquitto_callback_unregister(plugin_id, MOSQ_EVT_MESSAGE, on_message, NULL);
	mosquitto_callback_unregister(plugin_id, MOSQ_EVT_TICK, on_tick, NULL);
	if(thread_started){
		atomic_store(&stopping, true);
		if(write(wake_pipe[1], "s", 1) < 0){ /* the thread also stops at its next wake */ }
		pthread_join(thread, NULL);
		thread_started = false;
	}
	mosquitto_log_printf(MOSQ_LOG_NOTICE, "probe: copied %lu, sent %lu, acked %lu",
			atomic_load(&n_copied), atomic_load(&n_sent), atomic_load(&n_acked));
	free_list(head);
	head = tail = NULL;
	if(tick_fd >= 0) close(tick_fd);
	tick_fd = -1;
	free(tick_out.data);
	tick_out.data = NULL;
	tick_out.len = tick_out.cap = 0;
	for(int i = 0; i < 2; i++){
		if(wake_pipe[i] >= 0) close(wake_pipe[i]);
		wake_pipe[i] = -1;
	}
	free(filter);
	free(host);
	filter = host = NULL;
	return MOSQ_ERR_SUCCESS;
}
