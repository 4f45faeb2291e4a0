/* How many messages a link may send now (room.h): the C twin of the sidecar's QueueRoom
 * (sidecar/routing/inject_room.py), for links (linkout.c). A batch puts its messages in its
 * subscribers' queues within one loop iteration of the peer's Mosquitto, while each PUBACK
 * takes one off; past max_queued_messages Mosquitto drops silently. The peer's plugin answers
 * each batch after its routing with the fullest live subscriber's queue (inject.c, a slow
 * subscriber that holds the others back left out) and its bound, half its max_queued_messages:
 * batches go while that queue plus the messages not answered yet stays under the bound. A
 * queue at the bound that does not shrink for ROOM_GIVE_UP_MS (a subscriber that does not
 * read) lifts the bound until it is under it again: that subscriber then loses messages as on
 * one Mosquitto. */
#include <limits.h>

#include "room.h"

long room_left(const struct room *r)
{
	if(r->limit <= 0 || r->lifted) return LONG_MAX;
	return r->limit - r->queued - r->in_flight;
}

void room_sent(struct room *r, long n)
{
	r->in_flight += n;
}

bool room_answered(struct room *r, long n, long queued, long limit, int64_t now_ms)
{
	r->in_flight = r->in_flight > n ? r->in_flight - n : 0;
	if(limit >= 0) r->limit = limit;
	if(queued < 0) return false;
	r->queued = queued;
	if(r->limit <= 0 || queued < r->limit){
		r->stuck = false;
		r->lifted = false;
		return false;
	}
	if(!r->stuck || queued < r->lowest){ /* full, but draining */
		r->stuck = true;
		r->stuck_since_ms = now_ms;
		r->lowest = queued;
		return false;
	}
	if(!r->lifted && now_ms - r->stuck_since_ms >= ROOM_GIVE_UP_MS){
		r->lifted = true;
		return true;
	}
	return false;
}

void room_reset(struct room *r)
{
	r->in_flight = 0;
}
