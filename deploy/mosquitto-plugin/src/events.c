/* The event stream: seq numbering, the unacked buffer, the publish window, overflow. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mqfed.h"

static struct event *ring_at(size_t i)
{
	return &g.ring[(g.ring_head + i) % g.ring_cap];
}

uint64_t ev_oldest(void)
{
	return g.next_seq - g.ring_len;
}

int events_init(void)
{
	g.next_seq = 1;
	g.acked = 0;
	g.pub_next = 1;
	g.ring_cap = 1024;
	g.ring = calloc(g.ring_cap, sizeof(struct event));
	return g.ring ? 0 : -1;
}

static void ring_pop_front(void)
{
	struct event *e = ring_at(0);

	g.buf_bytes -= e->len;
	free(e->json);
	e->json = NULL;
	e->len = 0;
	g.ring_head = (g.ring_head + 1) % g.ring_cap;
	g.ring_len--;
}

static void ring_clear(void)
{
	while(g.ring_len > 0){
		ring_pop_front();
	}
	g.ring_head = 0;
	g.buf_bytes = 0;
}

void events_cleanup(void)
{
	if(g.ring){
		ring_clear();
		free(g.ring);
		g.ring = NULL;
	}
	g.ring_cap = 0;
}

static bool ring_grow(void)
{
	size_t ncap = g.ring_cap * 2;
	struct event *n = calloc(ncap, sizeof(struct event));
	size_t i;

	if(n == NULL) return false;
	for(i = 0; i < g.ring_len; i++){
		n[i] = *ring_at(i);
	}
	free(g.ring);
	g.ring = n;
	g.ring_cap = ncap;
	g.ring_head = 0;
	return true;
}

/* Discard every buffered event: the sidecar will see a gap and re-sync from a snapshot. */
static void overflow(const char *why)
{
	mosquitto_log_printf(MOSQ_LOG_WARNING,
			"mqfed: event buffer overflow (%s): discarding %lu unacked events up to seq %lu; "
			"the sidecar must re-sync from a snapshot",
			why, (unsigned long)g.ring_len, (unsigned long)(g.next_seq - 1));
	ring_clear();
	g.overflows++;
	/* The discarded events count as settled, so the window opens again: the sidecar receives
	 * the next events, sees the jump in seq and re-syncs. */
	if(g.acked < g.next_seq - 1) g.acked = g.next_seq - 1;
	if(g.pub_next < g.next_seq) g.pub_next = g.next_seq;
}

cJSON *ev_new(const char *type)
{
	cJSON *o = cJSON_CreateObject();

	if(o == NULL) return NULL;
	cJSON_AddNumberToObject(o, "v", 1);
	cJSON_AddStringToObject(o, "epoch", g.epoch);
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
	uint64_t seq = g.next_seq;
	char *json = NULL;
	cJSON *s;

	if(ev){
		s = cJSON_GetObjectItemCaseSensitive(ev, "seq");
		if(s) cJSON_SetNumberValue(s, (double)seq);
		json = cJSON_PrintUnformatted(ev);
		cJSON_Delete(ev);
	}
	g.next_seq++;
	g.events_total++;
	if(json == NULL){
		overflow("out of memory building an event");
		return;
	}
	if(g.ring_len == g.ring_cap && !ring_grow()){
		free(json);
		overflow("out of memory growing the buffer");
		return;
	}
	{
		struct event *e = ring_at(g.ring_len);
		e->json = json;
		e->len = strlen(json);
		g.ring_len++;
		g.buf_bytes += e->len;
	}
	if(g.ring_len > g.buf_max_events){
		overflow("buffer_max_events");
		return;
	}
	if(g.buf_bytes > g.buf_max_bytes){
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

	if(!g.publishing || g.sidecar == NULL) return;
	first = ev_oldest();
	if(g.pub_next < first) g.pub_next = first;
	while(g.pub_next < g.next_seq && g.pub_next <= g.acked + g.window){
		struct event *e = ring_at((size_t)(g.pub_next - first));
		int rc = mosquitto_broker_publish_copy(g.sidecar_id, MQFED_EVENTS_TOPIC,
				(int)e->len, e->json, 1, false, NULL);
		if(rc != MOSQ_ERR_SUCCESS){
			mosquitto_log_printf(MOSQ_LOG_WARNING, "mqfed: publishing event %lu failed (%d)",
					(unsigned long)g.pub_next, rc);
			break; /* retried at the next tick */
		}
		g.pub_next++;
	}
}

void ev_ack(uint64_t seq)
{
	if(seq >= g.next_seq) seq = g.next_seq - 1;
	if(seq > g.acked){
		g.acked = seq;
		while(g.ring_len > 0 && ev_oldest() <= g.acked){
			ring_pop_front();
		}
	}
	if(g.pub_next <= g.acked) g.pub_next = g.acked + 1;
	ev_publish_pending();
}

/* Restart publishing at from_seq. False (and *oldest set) if events before it are gone. */
bool ev_resume(uint64_t from_seq, uint64_t *oldest)
{
	uint64_t first = ev_oldest();

	if(from_seq < first || from_seq > g.next_seq){
		*oldest = first;
		return false;
	}
	if(from_seq - 1 > g.acked){
		g.acked = from_seq - 1;
	}
	while(g.ring_len > 0 && ev_oldest() < from_seq){
		ring_pop_front();
	}
	g.pub_next = from_seq;
	g.publishing = true;
	ev_publish_pending();
	return true;
}

/* A snapshot reflects every event so far: drop them and continue after the cut. */
uint64_t ev_snapshot_cut(void)
{
	uint64_t cut = g.next_seq - 1;

	ring_clear();
	if(cut > g.acked) g.acked = cut;
	g.pub_next = g.next_seq;
	g.publishing = true;
	return cut;
}
