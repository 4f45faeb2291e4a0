/*
 * Overload shedding: push back on publishers before Mosquitto discards copies it owes the
 * forwarding connection.
 *
 * Mosquitto PUBACKs a publisher on receipt, then queues a copy for every subscriber, the
 * forwarding connection (.fwd) included; past Receive Maximum + max_queued_messages copies
 * unacknowledged by .fwd it silently discards the rest, and those acknowledged messages never
 * reach the cluster. A plugin cannot delay a PUBACK, so while the cluster is overloaded the
 * plugin refuses the QoS > 0 publishes that .fwd would get: it disconnects their publisher
 * (without its will) before the message is stored or acknowledged, and the publisher resends
 * it after reconnecting. QoS 0 and publishes no peer wants are never refused.
 *
 * Overloaded means either
 *   - the sidecar says so: its lease (`pressure` command, shed_ms) has not run out, or
 *   - the copies Mosquitto holds for .fwd reach fwd_backlog_max, by this estimate: the copies
 *     the sidecar holds unacknowledged (its last report) + the copies routed to .fwd that it
 *     has not taken (routed, counted here at each READ check, minus its running count of
 *     copies taken, from each report). A sidecar that crashed, hangs or restarts reports
 *     nothing, so every copy routed to .fwd counts until it is back. With capture on
 *     (capture.c) the records it holds unacknowledged are added, counted exactly.
 */
#include <stdlib.h>
#include <string.h>

#include "ftrie.h"
#include "model.h"
#include "shed.h"

/* A filter the forwarding connection subscribes to. */
struct fwd_filter {
	UT_hash_handle hh;         /* keyed by filter, verbatim */
	char *filter;
	const char *match;         /* filter without $share/<group>/ */
};

static struct fwd_filter *fwd_filters;
static struct ftrie fwd_trie;     /* every fwd_filters' match, for shed_wanted */
static uint64_t fwd_backlog_max;  /* option fwd_backlog_max: 0 = never shed on the estimate */
static uint64_t fwd_since_report; /* QoS>0 copies routed to .fwd since the sidecar's last report */
static uint64_t fwd_unread;       /* routed to .fwd, not taken by the sidecar (at its last report) */
static uint64_t fwd_reported_unacked;
static uint64_t fwd_taken_seen;   /* the sidecar's running count of copies taken, last reported */
static uint64_t capture_held;     /* records capture.c holds unacknowledged (exact) */
/* the sidecar's lease: shed while mono_ms() < this (monotonic: a step of the wall clock
 * neither ends nor prolongs it) */
static int64_t shed_until_ms;
static uint64_t shed_total;       /* publishers disconnected */
static int64_t shed_logged_ms;

void shed_init(uint64_t backlog_max)
{
	fwd_backlog_max = backlog_max;
}

void shed_fwd_filter(const char *filter, bool subscribed)
{
	struct fwd_filter *f;

	HASH_FIND(hh, fwd_filters, filter, strlen(filter), f);
	if(subscribed && f == NULL){
		f = calloc(1, sizeof(*f));
		if(f) f->filter = strdup(filter);
		if(f == NULL || f->filter == NULL){
			free(f);
			return;
		}
		f->match = strip_share(f->filter);
		if(!ftrie_add(&fwd_trie, f->match)){
			free(f->filter);
			free(f);
			return;
		}
		HASH_ADD_KEYPTR(hh, fwd_filters, f->filter, strlen(f->filter), f);
	}else if(!subscribed && f != NULL){
		ftrie_remove(&fwd_trie, f->match);
		HASH_DEL(fwd_filters, f);
		free(f->filter);
		free(f);
	}
}

void shed_fwd_routed(uint8_t qos)
{
	if(qos > 0) fwd_since_report++;
}

/* `taken` is the sidecar's running count (it restarts from 0 with the sidecar). Copies it
 * takes again after a reconnect count twice, so the estimate errs low, never high, and it
 * starts again from 0 at every reconnect of .fwd. */
void shed_report(uint64_t unacked, uint64_t taken, int64_t lease_ms)
{
	uint64_t fresh = taken >= fwd_taken_seen ? taken - fwd_taken_seen : taken;
	uint64_t routed = fwd_unread + fwd_since_report;

	fwd_unread = routed > fresh ? routed - fresh : 0;
	fwd_taken_seen = taken;
	fwd_since_report = 0;
	fwd_reported_unacked = unacked;
	shed_until_ms = lease_ms > 0 ? mono_ms() + lease_ms : 0;
}

void shed_fwd_connected(void)
{
	fwd_unread = 0;
	fwd_reported_unacked = 0;
}

/* capture.c: the records it holds for the sidecar, unacknowledged (the copies Mosquitto would
 * otherwise hold for .fwd). */
void shed_capture_held(uint64_t records)
{
	capture_held = records;
}

uint64_t shed_backlog(void)
{
	return fwd_reported_unacked + fwd_unread + fwd_since_report + capture_held;
}

bool shed_active(void)
{
	if(shed_until_ms != 0 && mono_ms() < shed_until_ms) return true;
	return fwd_backlog_max > 0 && shed_backlog() >= fwd_backlog_max;
}

/* Whether a forwarding filter matches: exact at any number of filters (a trie). */
bool shed_wanted(const char *topic)
{
	return ftrie_matches(&fwd_trie, topic);
}

/* From the MESSAGE callback of an ordinary client's publish. True when the publisher was
 * disconnected: the caller then fails the publish, which Mosquitto neither stores nor acks. */
bool shed_publish(struct mosquitto *client, const char *topic, uint8_t qos)
{
	char *id;
	int64_t now;

	if(qos == 0 || topic == NULL || !shed_active() || !shed_wanted(topic)) return false;
	id = xstrdup(mosquitto_client_id(client));
	if(id == NULL) return false;
	pending_resolve_conn(client); /* it published: its connect was accepted */
	shed_total++;
	now = mono_ms();
	if(now - shed_logged_ms >= 1000){
		shed_logged_ms = now;
		mosquitto_log_printf(MOSQ_LOG_WARNING,
				"mqfed: the cluster is overloaded (its forwarding backlog is near Mosquitto's "
				"limit): disconnected publisher '%s' before acknowledging its message, which it "
				"resends after reconnecting (%llu publishers shed so far)",
				id, (unsigned long long)shed_total);
	}
	/* Kicked without its will: the client did nothing wrong. */
	model_kick(client, id, false);
	free(id);
	return true;
}

void shed_cleanup(void)
{
	struct fwd_filter *f, *tmp;

	HASH_ITER(hh, fwd_filters, f, tmp){
		HASH_DEL(fwd_filters, f);
		free(f->filter);
		free(f);
	}
	ftrie_free(&fwd_trie);
	fwd_backlog_max = fwd_since_report = fwd_unread = 0;
	fwd_reported_unacked = fwd_taken_seen = shed_total = capture_held = 0;
	shed_until_ms = shed_logged_ms = 0;
}

void shed_stats(struct shed_stats *s)
{
	s->filters = HASH_COUNT(fwd_filters);
	s->since_report = fwd_since_report;
	s->unread = fwd_unread;
	s->total = shed_total;
}
