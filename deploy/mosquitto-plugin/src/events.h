/* The event stream to the sidecar (events.c). */
#ifndef MQFED_EVENTS_H
#define MQFED_EVENTS_H

#include "util.h"

struct ev_stats {
	uint64_t seq;              /* last seq given */
	uint64_t acked;
	uint64_t buffered;         /* unacked events held */
	uint64_t buffered_bytes;
	uint64_t events_total;
	uint64_t overflows;
	uint64_t published;        /* last seq published */
};

int events_init(uint64_t window, uint64_t max_events, uint64_t max_bytes,
		uint64_t batch);
void events_cleanup(void);
const char *ev_epoch(void);
cJSON *ev_new(const char *type);
void ev_emit(cJSON *ev);
void ev_publish_pending(void);
void ev_stop_publishing(void);
void ev_ack(uint64_t seq);
bool ev_resume(uint64_t from_seq, uint64_t *oldest);
uint64_t ev_snapshot_cut(void);
uint64_t ev_oldest(void);
uint64_t ev_next_seq(void);
void ev_stats(struct ev_stats *s);

#endif
