/* The hold list (`hold` command): client ids whose OFFLINE session here queues nothing.
 *
 * - A plain hold: the client is served by another node (or a shadow made its session here
 *   ahead of it), so what Mosquitto routes to the session is refused (its READ check fails).
 * - A ring hold (a replica: the cluster keeps a copy of the session here, queueing only while
 *   its client is offline or its owner node is dead): refused messages of QoS > 0 are also kept
 *   for RING_MS. Released with `replay`, the ones refused at or after `since_ms` are delivered
 *   into the session, oldest first, ahead of anything routed to it later: the session then
 *   holds what its client missed since `since_ms` even if the sidecar learnt late that it
 *   must queue. The replay is done at the next tick (the end of Mosquitto's loop iteration),
 *   so the plugin's publishes are queued at the start of the next iteration, before any
 *   message read then; until that tick the session is still refused (and the ring grows).
 *   A batch injected in that iteration (inject.c) is already in Mosquitto's plugin queue,
 *   ahead of the replay: a hold that keeps (a ring, an armed live hold) then waits for a tick
 *   with no injection before it (at most WAIT_MAX_MS), keeping those messages after the rest.
 * - A live hold (`live`): a session moving here whose old node will hand its queue over.
 *   Until its client connects, a plain hold. Once it has connected (armed), what Mosquitto
 *   routes to the client, online or not, is refused and kept (QoS 0 too while online; a
 *   shared group's pick is granted), and released after the old node's queue was delivered:
 *   so the client gets that queue before the messages routed to it here meanwhile, in
 *   per-publisher order, as from one broker. Its ring is never trimmed: past its limits, or
 *   armed for LIVE_MAX_MS (the sidecar gone), it releases itself. Held again plain (its
 *   client moves on), it first hands what it kept to the session, then refuses.
 *   A READ check does not see the message's properties: the ring takes them from the routing
 *   it belongs to, as origin.c (the forwarding connection's re-injections) and recent.c
 *   (clients' publishes, with catch-up on) find it; a message matching exactly one (plain)
 *   subscription of the session is replayed at that subscription's QoS and with its
 *   Subscription Identifier, as Mosquitto would have queued it. With more than one matching
 *   subscription each refused copy keeps the publish QoS and no identifier.
 * - Cut mode (`cut`, docs/architecture.md §5 "Exactly once across a move under traffic",
 *   cut.c): a moving session's copies split what was routed to both while its client moved.
 *   - The new copy (a live hold in cut mode): arms at the tick after its client's connect,
 *     delivering `.fwd` the probe `cut:<client>` at that tick (every copy routed before it is
 *     ahead of it there, every copy routed after behind): the sidecar makes that this node's
 *     cut, which the old copy applies to this node's messages. Before that tick its checks
 *     are refused and not kept (the old copy gets those). Its ring keeps each injected
 *     message's identity and, released with what the old copy queued and the old node's cut,
 *     leaves those out at QoS > 0 (an offline session drops QoS 0: the old copy had none).
 *   - The old copy, held in cut mode: queues until the next tick, then is held, with the same
 *     marker: the old node's own cut.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "batch.h"
#include "capture.h"
#include "cut.h"
#include "hold.h"
#include "inject.h"
#include "model.h"
#include "origin.h"
#include "recent.h"
#include "sidecar.h"

#define RING_MS 10000                      /* a ring keeps what it was refused this long */
#define RING_BYTES_PER_HOLD (4u << 20)     /* and at most this many payload + topic bytes */
#define RING_MESSAGES_PER_HOLD 20000u
#define RING_BYTES_TOTAL ((uint64_t)64 << 20) /* over every ring */
#define LIVE_MAX_MS 30000                  /* an armed live hold releases itself after this */
#define WAIT_MAX_MS 200                    /* a replay waits for a tick without injection */

struct held_msg {
	struct held_msg *next;
	int64_t at_ms;
	char *topic;
	void *payload;
	mosquitto_property *props; /* the message's, and the subscription's identifier */
	size_t props_bytes;
	uint32_t len;
	uint8_t qos;
	uint64_t origin;           /* cut mode: an injected message's origin (hash), seq; 0: local */
	uint64_t seq;
};


struct hold {
	UT_hash_handle hh;
	char *id;
	bool ring;
	bool live;           /* a moving session: rings once its client connected (armed) */
	bool armed;
	int64_t armed_ms;
	bool releasing;      /* replay at the next tick, then remove */
	int64_t waiting_ms;  /* since when the replay waits for a tick without injection (0: not) */
	bool keep;           /* ...then stay on, plain (held again while releasing a live ring) */
	int64_t since_ms;
	struct held_msg *head, *tail;
	size_t bytes;
	unsigned count;
	bool arm_owed;       /* cut mode, new copy: arm, with the marker, at the next tick */
	bool hold_owed;      /* cut mode, old copy: queues until the next tick, then held (plain),
	                      * with the marker */
	struct move *move;   /* cut mode, new copy (live): what it leaves out at release (cut.c) */
};

static struct hold *holds;
static unsigned releasing;
static unsigned rings;           /* ring holds */
static unsigned armed;           /* armed live holds */
static unsigned lives;           /* live holds: a connected client's checks look only then */
static int64_t armed_checked_ms; /* when hold_tick last looked for armed holds past LIVE_MAX_MS */
static uint64_t ring_bytes, ring_messages, replayed, replays_waited, replays_flushed;
static uint64_t chains_cut;      /* chained moves' old copies held in cut mode */
static unsigned owed;            /* holds with an arm or a hold owed at the next tick */


static struct hold *find(const char *id)
{
	struct hold *h = NULL;

	if(id == NULL || holds == NULL) return NULL;
	HASH_FIND_STR(holds, id, h);
	return h;
}

static size_t msg_bytes(const struct held_msg *m)
{
	return (size_t)m->len + strlen(m->topic) + m->props_bytes + sizeof(*m);
}

static void drop_oldest(struct hold *h)
{
	struct held_msg *m = h->head;

	h->head = m->next;
	if(h->head == NULL) h->tail = NULL;
	h->bytes -= msg_bytes(m);
	h->count--;
	ring_bytes -= msg_bytes(m);
	ring_messages--;
	free(m->topic);
	free(m->payload);
	mosquitto_property_free_all(&m->props);
	free(m);
}

/* Out of cut mode (the move, its cuts and identities, are forgotten). */
static void leave_cut_mode(struct hold *h)
{
	if(h->move) move_close(h->id);
	h->move = NULL;
}

static void remove_hold(struct hold *h)
{
	while(h->head) drop_oldest(h);
	if(h->releasing) releasing--;
	if(h->ring && --rings == 0) origin_keep_props(false);
	if(h->armed) armed--;
	if(h->live) lives--;
	if(h->arm_owed || h->hold_owed) owed--;
	leave_cut_mode(h);
	HASH_DEL(holds, h);
	free(h->id);
	free(h);
}

static void set_owed(struct hold *h, bool *flag, bool on)
{
	bool before = h->arm_owed || h->hold_owed;

	*flag = on;
	if(before != (h->arm_owed || h->hold_owed)) before ? owed-- : owed++;
}

/* The probe `cut:<id>` to the forwarding connection: every copy routed before it is ahead of
 * it there, every copy routed after it behind (delivered at the top of the next iteration).
 * A new copy's (`arm`) also says when its client connected here (hold.h). With capture on,
 * the messages reach the sidecar as records: the cut is a record among them (appended at this
 * tick: after this iteration's records, before the next's), the connect time its payload. */
static void send_marker(const struct hold *h, bool arm)
{
	size_t n = strlen(h->id);
	struct client *c = arm ? model_find(h->id) : NULL;
	int64_t connect_ms = c ? model_client_connect_ms(c) : 0;
	char when[21] = "";
	int when_len = connect_ms > 0 ? snprintf(when, sizeof(when), "%lld",
			(long long)connect_ms) : 0;
	char *payload;
	int len = (int)(n + 4);

	if(capture_marker(MQFB_KIND_CUT, h->id, when, (uint32_t)when_len)) return;
	payload = malloc(n + 4 + 1 + sizeof(when));
	if(payload == NULL) return;
	memcpy(payload, "cut:", 4);
	memcpy(payload + 4, h->id, n);
	if(when_len > 0){
		payload[len++] = '\0';
		memcpy(payload + len, when, (size_t)when_len);
		len += when_len;
	}
	mosquitto_broker_publish_copy(sidecar_fwd_id(), CUT_PROBE_TOPIC, len, payload, 1, false,
			NULL);
	free(payload);
}

static void release_at_tick(struct hold *h, int64_t since_ms, bool keep)
{
	if(!h->releasing) releasing++;
	h->releasing = true;
	h->since_ms = since_ms;
	h->keep = keep;
}

/* `h` no longer replays at a tick (it did, or it is held again). */
static void stop_releasing(struct hold *h)
{
	if(h->releasing) releasing--;
	h->releasing = h->keep = false;
	h->waiting_ms = 0;
}

static void set_armed(struct hold *h, bool on)
{
	if(on && !h->armed){
		armed++;
		h->armed_ms = mono_ms();
	}else if(!on && h->armed){
		armed--;
	}
	h->armed = on;
}

/* Deliver what `h` kept at or after its `since_ms` into its session (targeted: queued for an
 * offline session, no READ check), less what the old copy of its move had; then empty it. */
static void replay(struct hold *h)
{
	struct held_msg *m;

	for(m = h->head; m; m = m->next){
		if(m->at_ms < h->since_ms) continue;
		if(h->move && m->qos > 0 && move_skips(h->move, m->origin, m->seq)){
			cut_count_skipped(); /* the old copy had it */
			continue;
		}
		/* Mosquitto owns the properties once it took the message */
		if(mosquitto_broker_publish_copy(h->id, m->topic, (int)m->len, m->payload,
					m->qos, false, m->props) == MOSQ_ERR_SUCCESS){
			m->props = NULL;
			replayed++;
			if(m->qos > 0) model_note_queued(h->id);
			/* queued for a client away (no READ check saw it): granted to its next move,
			 * whose new copy leaves it out (cut.c; a no-op while it is connected here) */
			if(m->qos > 0 && m->origin) cut_note_granted(h->id, m->origin, m->seq);
		}
	}
	while(h->head) drop_oldest(h);
}

/* A chained move's old copy in cut mode, at its tick: what its live ring kept goes into the
 * session now (less what its own old copy had: the skips it was given), and it is a plain
 * hold from here on. */
static void chain_to_plain(struct hold *h)
{
	stop_releasing(h);
	h->since_ms = 0;
	replay(h);
	set_armed(h, false);
	if(h->live) lives--;
	h->live = false;
	leave_cut_mode(h);
	chains_cut++;
}

/* Hold `id`'s session (a ring hold keeps what it refuses; a live one, see above).
 * 0, or -1: out of memory. */
int hold_set(const char *id, bool ring, bool live, bool cut)
{
	struct hold *h = find(id);
	bool chained, cut_hold;

	if(h != NULL && h->armed && h->releasing && !h->keep && !live){
		/* its move settled (released, the replay waiting for a tick without injection)
		 * and its client moved on since: the session takes that replay now, ahead of what
		 * it queues until this hold takes effect, and the onward move is an ordinary one
		 * (in cut mode). (Holding it as a chained move made the two copies overlap.) */
		replay(h);
		stop_releasing(h);
		set_armed(h, false);
		replays_flushed++;
	}
	/* its client moves on before its live ring was released: that ring, filtered by this
	 * move's cuts, goes into the session */
	chained = h != NULL && h->armed && !live;
	cut_hold = cut && !ring && !live;
	if(chained && cut_hold && h->move != NULL){
		/* ...in cut mode (the onward move's old copy): the ring keeps until the next tick,
		 * where it goes into the session, the hold turns plain and its marker goes out
		 * (`hold_tick`), so this node's messages before the marker are in the session,
		 * those after refused here (the onward copy keeps them) */
		set_owed(h, &h->hold_owed, true);
		return 0;
	}

	if(h == NULL){
		h = calloc(1, sizeof(*h));
		if(h) h->id = strdup(id);
		if(h == NULL || h->id == NULL){
			free(h);
			return -1;
		}
		HASH_ADD_KEYPTR(hh, holds, h->id, strlen(h->id), h);
	}
	if(h->armed && !live){
		/* its client moves on: what the live ring kept goes into the session first */
		release_at_tick(h, 0, true);
		set_armed(h, false);
	}else if(h->releasing && !h->keep){
		/* held again before the replay: keep the ring, replay nothing */
		stop_releasing(h);
	}
	if(!ring && !h->keep && !(live && h->armed)) while(h->head) drop_oldest(h);
	if(ring != h->ring) ring ? rings++ : rings--;
	h->ring = ring;
	if(!live) set_armed(h, false);
	if(live != h->live) live ? lives++ : lives--;
	h->live = live;
	if(!chained){
		if(!(cut && live && !ring)) leave_cut_mode(h);
		else if(h->move == NULL) h->move = move_open(h->id); /* NULL: no memory, no cuts */
	}
	if(!live) set_owed(h, &h->arm_owed, false);
	/* the old copy of a move is held at the next tick, with its cut: until then it queues */
	set_owed(h, &h->hold_owed, cut_hold && !chained);
	origin_keep_props(rings > 0); /* re-injections' properties, for the rings */
	return 0;
}

/* A client connected here: the live hold of a move in cut mode arms at the next tick. */
void hold_on_connect(const char *id)
{
	struct hold *h;

	if(lives == 0) return;
	h = find(id);
	if(h && h->live && h->move && !h->armed) set_owed(h, &h->arm_owed, true);
}

/* What the ring keeps of a refused message besides topic and payload: its QoS and properties
 * as its session would have queued it. False: nothing to keep (effective QoS 0). */
static bool ring_meta(const char *id, struct held_msg *m, const char *topic,
		const void *payload, uint32_t len, uint8_t qos, bool qos0)
{
	const mosquitto_property *props = origin_routed_props(topic, payload, len, qos);
	struct client *c = model_find(id);
	uint8_t sub_qos = qos;
	uint32_t sub_id = 0;

	if(props == NULL) props = recent_routed_props(topic, payload, len, qos);
	if(c && model_single_plain_match(c, topic, &sub_qos, &sub_id) && sub_qos < qos){
		qos = sub_qos;
	}
	if(qos == 0 && !qos0) return false; /* an offline session drops QoS 0 */
	m->qos = qos;
	/* without memory for them the message is kept without its properties */
	if(props && mosquitto_property_copy_all(&m->props, props) != MOSQ_ERR_SUCCESS){
		mosquitto_property_free_all(&m->props);
	}
	if(sub_id && mosquitto_property_add_varint(&m->props, MQTT_PROP_SUBSCRIPTION_IDENTIFIER,
				sub_id) != MOSQ_ERR_SUCCESS){
		mosquitto_property_free_all(&m->props);
	}
	m->props_bytes = properties_size(m->props);
	return true;
}

/* Let `id`'s offline session queue again; with `replay`, a ring hold first delivers what it
 * refused at or after `since_ms` (at the next tick). */
void hold_release(const char *id, bool replay, int64_t since_ms)
{
	struct hold *h = find(id);

	if(h == NULL) return;
	if(h->armed){ /* a live ring: everything it kept, whatever was asked */
		set_owed(h, &h->hold_owed, false); /* (a chained move's hold that had not begun) */
		release_at_tick(h, 0, false);
		return;
	}
	if(h->keep){ /* its live ring is still to be handed to the session: then off */
		h->keep = false;
		return;
	}
	if(!replay || !h->ring){
		remove_hold(h);
		return;
	}
	release_at_tick(h, since_ms, false);
}

/* The client of `id` connected here (or left after connecting): a live hold arms. */
void hold_connected(const char *id)
{
	struct hold *h = find(id);

	if(h && h->live) set_armed(h, true);
}

/* Whether a message routed to `id`'s offline session is refused (kept, for a ring hold).
 * `shared_check`: the check is for a shared subscription (origin_shared_check). A plain hold
 * grants those: Mosquitto 2.0.11 drops a group's message whose pick is refused (it tries no
 * other member), and a group's message reaches one member cluster-wide, so it cannot come
 * twice; the copy queues it for the client that takes it over, or hands it over in its
 * drain. (A replica, a ring hold, makes no shared subscription.) */
bool hold_refuses(const char *id, bool shared_check, bool online, const char *topic,
		const void *payload, uint32_t len, uint8_t qos)
{
	struct hold *h;
	struct held_msg *m;
	int64_t now;
	bool live;
	uint64_t origin = 0, seq = 0;

	if(online && lives == 0) return false; /* (no lookup) */
	h = find(id);
	if(h == NULL) return false;
	/* cut mode: the old copy queues until its hold's tick (a chained one's ring keeps) */
	if(h->hold_owed && !h->armed) return false;
	if(online && h->live){
		if(h->move == NULL){
			set_armed(h, true);
		}else if(!h->armed){
			/* cut mode: it arms at the tick, with its cut; before, the old copy gets it */
			set_owed(h, &h->arm_owed, true);
			return !shared_check;
		}
	}
	live = h->armed;
	if(online && !live) return false; /* only a live hold acts on a connected client */
	if(live && !online && origin_read_identity(&origin, &seq) && cut_refuses(id, origin, seq)){
		return true; /* its client left: the next node's messages from its cut are its own */
	}
	if(shared_check && (live || !h->ring)) return false; /* (a plain or live hold) */
	if(live && topic != NULL && (qos > 0 || online)){
		if(h->bytes + len > RING_BYTES_PER_HOLD || h->count >= RING_MESSAGES_PER_HOLD
				|| ring_bytes + len > RING_BYTES_TOTAL){
			/* never trimmed: past its limits it hands everything over at the next tick
			 * and ends (order may break after that; nothing is lost) */
			release_at_tick(h, 0, false);
		}
	}else if(!h->ring || qos == 0 || topic == NULL){
		return true; /* an offline session drops QoS 0 */
	}else{
		now = now_ms();
		while(h->head && (h->head->at_ms < now - RING_MS
					|| h->bytes + len > RING_BYTES_PER_HOLD
					|| h->count >= RING_MESSAGES_PER_HOLD
					|| ring_bytes + len > RING_BYTES_TOTAL)){
			drop_oldest(h);
		}
		if(ring_bytes + len > RING_BYTES_TOTAL || len > RING_BYTES_PER_HOLD) return true;
	}
	if(live) now = now_ms(); /* (the ring's branch has it) */
	m = calloc(1, sizeof(*m));
	if(m == NULL) return !live; /* a live hold lets it through rather than lose it */
	if(!ring_meta(id, m, topic, payload, len, qos, live && online)){
		free(m);
		return true;
	}
	m->topic = strdup(topic);
	m->payload = len ? malloc(len) : NULL;
	if(m->topic == NULL || (len && m->payload == NULL)){
		free(m->topic);
		free(m->payload);
		mosquitto_property_free_all(&m->props);
		free(m);
		return !live;
	}
	if(len) memcpy(m->payload, payload, len);
	m->len = len;
	m->at_ms = now;
	if(h->move && origin_read_identity(&origin, &seq)){
		m->origin = origin;
		m->seq = seq;
	}
	if(h->tail) h->tail->next = m;
	else h->head = m;
	h->tail = m;
	h->bytes += msg_bytes(m);
	h->count++;
	ring_bytes += msg_bytes(m);
	ring_messages++;
	return true;
}

/* The end of a loop iteration: replay and remove the holds being released. */
void hold_tick(void)
{
	struct hold *h, *tmp;
	bool injected = inject_take_queued();
	int64_t now_mono = 0;

	cut_tick(mono_ms());
	if(owed > 0){ /* cut mode: arms and holds take effect now, each with its cut's marker */
		HASH_ITER(hh, holds, h, tmp){
			if(h->arm_owed){
				set_owed(h, &h->arm_owed, false);
				set_armed(h, true);
				send_marker(h, true);
			}else if(h->hold_owed){
				set_owed(h, &h->hold_owed, false);
				if(h->armed) chain_to_plain(h);
				send_marker(h, false);
			}
		}
	}
	if(armed > 0){
		int64_t now = mono_ms();

		if(now - armed_checked_ms >= 1000){ /* (a pass over every hold: once a second) */
			armed_checked_ms = now;
			HASH_ITER(hh, holds, h, tmp){
				if(h->armed && now - h->armed_ms > LIVE_MAX_MS) release_at_tick(h, 0, false);
			}
		}
	}
	if(releasing == 0) return;
	HASH_ITER(hh, holds, h, tmp){
		if(!h->releasing) continue;
		if(injected && (h->armed || h->ring)){ /* routed next, ahead of a replay now */
			if(now_mono == 0) now_mono = mono_ms();
			if(h->waiting_ms == 0) h->waiting_ms = now_mono;
			if(now_mono - h->waiting_ms < WAIT_MAX_MS){
				replays_waited++;
				continue;
			}
		}
		h->waiting_ms = 0;
		replay(h);
		if(h->keep){ /* stays on, plain */
			stop_releasing(h);
		}else{
			remove_hold(h);
		}
	}
}

/* Release `id`'s live hold without what its old copy had: `granted` (its identities, from
 * `granted` there) and, per origin, what was below its cut (`cuts`: [[node, seq]]).
 * 0, or -1: malformed. */
int hold_release_skipping(const char *id, const cJSON *granted, const cJSON *cuts)
{
	struct hold *h = find(id);

	if(h != NULL && h->move != NULL){
		if(move_set_skips(h->move, granted, cuts) != 0) return -1;
	}else if(move_set_skips(NULL, granted, cuts) != 0){
		return -1;
	}
	hold_release(id, false, 0);
	return 0;
}

/* A chained move's old copy, held in cut mode (`hold_set`): its live ring goes into the
 * session without what its own old copy had (as `hold_release_skipping`). 0, or -1:
 * malformed. */
int hold_chain_skips(const char *id, const cJSON *granted, const cJSON *cuts)
{
	struct hold *h = find(id);

	return move_set_skips(h != NULL && h->armed ? h->move : NULL, granted, cuts);
}

void hold_stats(uint64_t *held, uint64_t *messages, uint64_t *bytes, uint64_t *replays,
		uint64_t *waited, uint64_t *flushed, uint64_t *chained)
{
	*held = HASH_COUNT(holds);
	*messages = ring_messages;
	*bytes = ring_bytes;
	*replays = replayed;
	*waited = replays_waited;
	*flushed = replays_flushed;
	*chained = chains_cut;
}

void hold_clear(void)
{
	struct hold *h, *tmp;

	HASH_ITER(hh, holds, h, tmp){
		remove_hold(h);
	}
	cut_clear();
	releasing = 0;
	rings = 0;
	armed = lives = owed = 0;
	armed_checked_ms = 0;
	origin_keep_props(false);
	ring_bytes = ring_messages = replayed = replays_waited = replays_flushed = chains_cut = 0;
}
