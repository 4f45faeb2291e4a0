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
 *     nothing, so every copy routed to .fwd counts until it is back.
 */
#include <stdlib.h>
#include <string.h>

#include "mqfed.h"

/* Beyond this many forwarding filters matching every one costs too much per publish: while
 * shedding, every QoS > 0 publish is then refused. */
#define SHED_MATCH_MAX 4096

void shed_fwd_filter(const char *filter, bool subscribed)
{
	struct fwd_filter *f;

	HASH_FIND(hh, g.fwd_filters, filter, strlen(filter), f);
	if(subscribed && f == NULL){
		f = calloc(1, sizeof(*f));
		if(f) f->filter = strdup(filter);
		if(f == NULL || f->filter == NULL){
			free(f);
			return;
		}
		f->match = strip_share(f->filter);
		HASH_ADD_KEYPTR(hh, g.fwd_filters, f->filter, strlen(f->filter), f);
	}else if(!subscribed && f != NULL){
		HASH_DEL(g.fwd_filters, f);
		free(f->filter);
		free(f);
	}
}

void shed_fwd_routed(uint8_t qos)
{
	if(qos > 0) g.fwd_since_report++;
}

/* `taken` is the sidecar's running count (it restarts from 0 with the sidecar). Copies it
 * takes again after a reconnect count twice, so the estimate errs low, never high, and it
 * starts again from 0 at every reconnect of .fwd. */
void shed_report(uint64_t unacked, uint64_t taken, int64_t lease_ms)
{
	uint64_t fresh = taken >= g.fwd_taken_seen ? taken - g.fwd_taken_seen : taken;
	uint64_t routed = g.fwd_unread + g.fwd_since_report;

	g.fwd_unread = routed > fresh ? routed - fresh : 0;
	g.fwd_taken_seen = taken;
	g.fwd_since_report = 0;
	g.fwd_reported_unacked = unacked;
	g.shed_until_ms = lease_ms > 0 ? now_ms() + lease_ms : 0;
}

void shed_fwd_connected(void)
{
	g.fwd_unread = 0;
	g.fwd_reported_unacked = 0;
}

uint64_t shed_backlog(void)
{
	return g.fwd_reported_unacked + g.fwd_unread + g.fwd_since_report;
}

bool shed_active(void)
{
	if(g.shed_until_ms != 0 && now_ms() < g.shed_until_ms) return true;
	return g.fwd_backlog_max > 0 && shed_backlog() >= g.fwd_backlog_max;
}

static bool wanted_by_fwd(const char *topic)
{
	struct fwd_filter *f, *tmp;
	bool match;

	if(HASH_COUNT(g.fwd_filters) > SHED_MATCH_MAX) return true;
	HASH_ITER(hh, g.fwd_filters, f, tmp){
		match = false;
		if(mosquitto_topic_matches_sub(f->match, topic, &match) == MOSQ_ERR_SUCCESS && match){
			return true;
		}
	}
	return false;
}

/* From the MESSAGE callback of an ordinary client's publish. True when the publisher was
 * disconnected: the caller then fails the publish, which Mosquitto neither stores nor acks. */
bool shed_publish(struct mosquitto *client, const char *topic, uint8_t qos)
{
	struct pending *p;
	char *id;
	int64_t now;

	if(qos == 0 || topic == NULL || !shed_active() || !wanted_by_fwd(topic)) return false;
	id = xstrdup(mosquitto_client_id(client));
	if(id == NULL) return false;
	p = pending_find(client);
	if(p) pending_resolve(p); /* it published: its connect was accepted */
	g.shed_total++;
	now = now_ms();
	if(now - g.shed_logged_ms >= 1000){
		g.shed_logged_ms = now;
		mosquitto_log_printf(MOSQ_LOG_WARNING,
				"mqfed: the cluster is overloaded (its forwarding backlog is near Mosquitto's "
				"limit): disconnected publisher '%s' before acknowledging its message, which it "
				"resends after reconnecting (%llu publishers shed so far)",
				id, (unsigned long long)g.shed_total);
	}
	/* Mosquitto re-checks the subscriptions of a persistent client it kicks: g.kicking marks
	 * them as re-checks. Kicked without its will: the client did nothing wrong. */
	g.kicking = client;
	mosquitto_kick_client_by_clientid(id, false);
	g.kicking = NULL;
	free(id);
	return true;
}

void shed_cleanup(void)
{
	struct fwd_filter *f, *tmp;

	HASH_ITER(hh, g.fwd_filters, f, tmp){
		HASH_DEL(g.fwd_filters, f);
		free(f->filter);
		free(f);
	}
}
