/* The event stream: its epoch, seq numbering, the unacked buffer, the publish window, overflow. */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "events.h"
#include "sidecar.h"

#define EVENTS_TOPIC "$SYS/broker/mqfed/events"

struct event {
	char *json;
	size_t len;
};

/* options */
static uint64_t window;
static uint64_t batch = 1;     /* events per message at most (newline-separated) */
static uint64_t buf_max_events;
static uint64_t buf_max_bytes;

static char epoch[17];

/* the buffer holds seqs [next_seq - ring_len, next_seq) */
static uint64_t next_seq;
static struct event *ring;
static size_t ring_cap;
static size_t ring_head;
static size_t ring_len;
static uint64_t buf_bytes;
static uint64_t acked;
static uint64_t pub_next;
static bool publishing;        /* the sidecar asked with resume or snapshot */
static uint64_t events_total;
static uint64_t overflows;

static struct event *ring_at(size_t i)
{
	return &ring[(ring_head + i) % ring_cap];
}

uint64_t ev_oldest(void)
{
	return next_seq - ring_len;
}

uint64_t ev_next_seq(void)
{
	return next_seq;
}

const char *ev_epoch(void)
{
	return epoch;
}

static void make_epoch(void)
{
	unsigned char rnd[8];
	size_t got = 0;
	int fd = open("/dev/urandom", O_RDONLY | O_CLOEXEC);
	int i;

	if(fd >= 0){
		while(got < sizeof(rnd)){
			ssize_t n = read(fd, rnd + got, sizeof(rnd) - got);
			if(n <= 0) break;
			got += (size_t)n;
		}
		close(fd);
	}
	if(got < sizeof(rnd)){
		uint64_t x = (uint64_t)now_ms() ^ ((uint64_t)getpid() << 32);
		memcpy(rnd, &x, sizeof(rnd));
	}
	for(i = 0; i < 8; i++){
		snprintf(epoch + 2 * i, 3, "%02x", rnd[i]);
	}
}

int events_init(uint64_t window_opt, uint64_t max_events, uint64_t max_bytes,
		uint64_t batch_opt)
{
	window = window_opt;
	batch = batch_opt ? batch_opt : 1;
	buf_max_events = max_events;
	buf_max_bytes = max_bytes;
	next_seq = 1;
	acked = 0;
	pub_next = 1;
	ring_cap = 1024;
	ring = calloc(ring_cap, sizeof(struct event));
	if(ring == NULL) return -1;
	make_epoch();
	return 0;
}

static void ring_pop_front(void)
{
	struct event *e = ring_at(0);

	buf_bytes -= e->len;
	free(e->json);
	e->json = NULL;
	e->len = 0;
	ring_head = (ring_head + 1) % ring_cap;
	ring_len--;
}

static void ring_clear(void)
{
	while(ring_len > 0){
		ring_pop_front();
	}
	ring_head = 0;
	buf_bytes = 0;
}

void events_cleanup(void)
{
	if(ring){
		ring_clear();
		free(ring);
	}
	window = buf_max_events = buf_max_bytes = 0;
	memset(epoch, 0, sizeof(epoch));
	next_seq = acked = pub_next = buf_bytes = events_total = overflows = 0;
	ring = NULL;
	ring_cap = ring_head = ring_len = 0;
	publishing = false;
}

void ev_stop_publishing(void)
{
	publishing = false;
}

void ev_stats(struct ev_stats *s)
{
	s->seq = next_seq - 1;
	s->acked = acked;
	s->buffered = ring_len;
	s->buffered_bytes = buf_bytes;
	s->events_total = events_total;
	s->overflows = overflows;
	s->published = pub_next - 1;
}

static bool ring_grow(void)
{
	size_t ncap = ring_cap * 2;
	struct event *n = calloc(ncap, sizeof(struct event));
	size_t i;

	if(n == NULL) return false;
	for(i = 0; i < ring_len; i++){
		n[i] = *ring_at(i);
	}
	free(ring);
	ring = n;
	ring_cap = ncap;
	ring_head = 0;
	return true;
}

/* Discard every buffered event: the sidecar will see a gap and re-sync from a snapshot. */
static void overflow(const char *why)
{
	mosquitto_log_printf(MOSQ_LOG_WARNING,
			"mqfed: event buffer overflow (%s): discarding %lu unacked events up to seq %lu; "
			"the sidecar must re-sync from a snapshot",
			why, (unsigned long)ring_len, (unsigned long)(next_seq - 1));
	ring_clear();
	overflows++;
	/* The discarded events count as settled, so the window opens again: the sidecar receives
	 * the next events, sees the jump in seq and re-syncs. */
	if(acked < next_seq - 1) acked = next_seq - 1;
	if(pub_next < next_seq) pub_next = next_seq;
}

cJSON *ev_new(const char *type)
{
	cJSON *o = cJSON_CreateObject();

	if(o == NULL) return NULL;
	cJSON_AddNumberToObject(o, "v", 1);
	cJSON_AddStringToObject(o, "epoch", epoch);
	cJSON_AddNumberToObject(o, "seq", 0); /* set by ev_emit */
	cJSON_AddNumberToObject(o, "t", (double)now_ms());
	cJSON_AddStringToObject(o, "type", type);
	return o;
}

/* Number, buffer and (window permitting) publish one event. Takes ownership of `ev`.
 * Never loses an event silently: if it cannot be stored, its seq is still consumed and the
 * buffer dropped, so the sidecar sees a gap. */
void ev_emit(cJSON *ev)
{
	uint64_t seq = next_seq;
	char *json = NULL;
	cJSON *s;

	if(ev){
		s = cJSON_GetObjectItemCaseSensitive(ev, "seq");
		if(s) cJSON_SetNumberValue(s, (double)seq);
		json = cJSON_PrintUnformatted(ev);
		cJSON_Delete(ev);
	}
	next_seq++;
	events_total++;
	if(json == NULL){
		overflow("out of memory building an event");
		return;
	}
	if(ring_len == ring_cap && !ring_grow()){
		free(json);
		overflow("out of memory growing the buffer");
		return;
	}
	{
		struct event *e = ring_at(ring_len);
		e->json = json;
		e->len = strlen(json);
		ring_len++;
		buf_bytes += e->len;
	}
	if(ring_len > buf_max_events){
		overflow("buffer_max_events");
		return;
	}
	if(buf_bytes > buf_max_bytes){
		overflow("buffer_max_bytes");
		return;
	}
	ev_publish_pending();
}

/* Publish buffered events to the sidecar, at most `window` beyond the last ack. Events are
 * addressed to the sidecar's client id (targeted delivery: no subscription needed, exactly one
 * copy, in order). Nothing is published until the sidecar asked with resume or snapshot. */
void ev_publish_pending(void)
{
	uint64_t first;
	char *buf = NULL;
	size_t cap = 0;

	if(!publishing || sidecar_conn() == NULL) return;
	first = ev_oldest();
	if(pub_next < first) pub_next = first;
	while(pub_next < next_seq && pub_next <= acked + window){
		/* the events waiting (window permitting), up to `batch` of them in one message */
		uint64_t n = 0, end = pub_next;
		size_t len = 0;
		const char *payload;
		int rc;

		while(end < next_seq && end <= acked + window && n < batch){
			len += ring_at((size_t)(end - first))->len + (n ? 1 : 0);
			end++;
			n++;
		}
		if(n == 1){
			payload = ring_at((size_t)(pub_next - first))->json;
		}else{
			uint64_t s;
			size_t off = 0;
			if(len > cap){
				char *grown = realloc(buf, len);
				if(grown == NULL) break; /* retried at the next tick */
				buf = grown;
				cap = len;
			}
			for(s = pub_next; s < end; s++){
				struct event *e = ring_at((size_t)(s - first));
				if(off) buf[off++] = '\n';
				memcpy(buf + off, e->json, e->len);
				off += e->len;
			}
			payload = buf;
		}
		rc = mosquitto_broker_publish_copy(sidecar_id(), EVENTS_TOPIC,
				(int)len, payload, 1, false, NULL);
		if(rc != MOSQ_ERR_SUCCESS){
			mosquitto_log_printf(MOSQ_LOG_WARNING, "mqfed: publishing event %lu failed (%d)",
					(unsigned long)pub_next, rc);
			break; /* retried at the next tick */
		}
		pub_next = end;
	}
	free(buf);
}

void ev_ack(uint64_t seq)
{
	if(seq >= next_seq) seq = next_seq - 1;
	if(seq > acked){
		acked = seq;
		while(ring_len > 0 && ev_oldest() <= acked){
			ring_pop_front();
		}
	}
	if(pub_next <= acked) pub_next = acked + 1;
	ev_publish_pending();
}

/* Restart publishing at from_seq. False (and *oldest set) if events before it are gone. */
bool ev_resume(uint64_t from_seq, uint64_t *oldest)
{
	uint64_t first = ev_oldest();

	if(from_seq < first || from_seq > next_seq){
		*oldest = first;
		return false;
	}
	if(from_seq - 1 > acked){
		acked = from_seq - 1;
	}
	while(ring_len > 0 && ev_oldest() < from_seq){
		ring_pop_front();
	}
	pub_next = from_seq;
	publishing = true;
	ev_publish_pending();
	return true;
}

/* A snapshot reflects every event so far: drop them and continue after the cut. */
uint64_t ev_snapshot_cut(void)
{
	uint64_t cut = next_seq - 1;

	ring_clear();
	if(cut > acked) acked = cut;
	pub_next = next_seq;
	publishing = true;
	return cut;
}
