/* Room in a peer's subscribers' queues, as its inject replies report it (room.c): how many
 * messages a link may send now. Sans-IO: the clock is passed in. */
#ifndef MQFED_ROOM_H
#define MQFED_ROOM_H

#include "util.h"

#define ROOM_PROBE_MS 10          /* no room, nothing unanswered: one batch this often */
#define ROOM_GIVE_UP_MS 5000      /* at the bound this long, not shrinking: the bound is lifted */

struct room {
	long limit;                   /* the peer's bound (half its max_queued_messages); 0: none */
	long in_flight;               /* messages of batches not answered yet */
	long queued;                  /* the fullest queue at the last measuring reply */
	bool lifted;                  /* a subscriber that does not read: no bound for now */
	bool stuck;
	int64_t stuck_since_ms;
	long lowest;
};

/* Messages that may go now (LONG_MAX: no bound). */
long room_left(const struct room *r);
void room_sent(struct room *r, long n);
/* A batch of `n` answered; `queued` its measure (< 0: none), `limit` the peer's bound as the
 * reply says it. True when this lifted the bound (worth a warning). */
bool room_answered(struct room *r, long n, long queued, long limit, int64_t now_ms);
/* The connection was lost: nothing is unanswered any more. */
void room_reset(struct room *r);

#endif
