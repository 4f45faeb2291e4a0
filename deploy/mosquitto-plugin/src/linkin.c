/*
 * Links in (issue 25, slice 3; docs/plugin-protocol.md "Links"): a peer's plugin connects
 * here over TCP with client id `mqfed-sidecar-link.<its node>.<its start>`, username
 * `mqfed-link` and the cluster's link secret (plugin_opt_link_secret), and publishes MQFB
 * batches to `$CONTROL/mqfed/inject` (inject.c injects them; Mosquitto PUBACKs after that).
 * Its ids begin with the sidecar's reserved prefix, so without the secret such a connect is
 * refused, and a connection that skipped BASIC_AUTH with one (TLS identity listeners) is an
 * impostor (plugin.c). A link may write the inject topic and nothing else.
 *
 * After a reconnect the peer writes again every batch it had no PUBACK for: the records it
 * already injected are dropped here. Records of one link come in seq order, so what was
 * injected is one number per link client id, kept across its reconnects and forgotten
 * FORGET_MS after its last use (at most SEEN_MAX, the least recently used first). A peer that
 * restarts uses a new client id, with seqs from 1 again.
 */
#include <stdlib.h>
#include <string.h>

#include "linkin.h"

#define SEEN_MAX 1024
#define FORGET_MS (10 * 60 * 1000)
#define SWEEP_MS 10000

struct seen {                    /* per link client id */
	UT_hash_handle hh;
	char *id;
	uint64_t last_seq;           /* every record up to it was injected */
	int64_t used_ms;
};

struct live {                    /* per link connection */
	UT_hash_handle hh;           /* keyed by conn (pointer) */
	const struct mosquitto *conn;
	struct seen *seen;
};

static char *secret;
static struct seen *seen_by_id;
static unsigned n_seen;
static struct live *lives;
static int64_t last_sweep_ms;
static struct ratelog refused_log;
static struct linkin_stats st;

int linkin_init(const char *link_secret)
{
	if(link_secret == NULL) return MOSQ_ERR_SUCCESS;
	secret = xstrdup(link_secret);
	return secret ? MOSQ_ERR_SUCCESS : MOSQ_ERR_NOMEM;
}

bool linkin_is_id(const char *id)
{
	return id != NULL && strncmp(id, LINK_ID_PREFIX, strlen(LINK_ID_PREFIX)) == 0;
}

static void seen_free(struct seen *s)
{
	HASH_DEL(seen_by_id, s);
	n_seen--;
	free(s->id);
	free(s);
}

/* Whether a live link connection uses this state. */
static bool in_use(const struct seen *s)
{
	struct live *l, *tmp;

	HASH_ITER(hh, lives, l, tmp){
		if(l->seen == s) return true;
	}
	return false;
}

/* The state of a link client id, made if needed; NULL when out of memory. */
static struct seen *seen_for(const char *id)
{
	struct seen *s, *tmp, *oldest = NULL;

	HASH_FIND_STR(seen_by_id, id, s);
	if(s) return s;
	if(n_seen >= SEEN_MAX){
		HASH_ITER(hh, seen_by_id, s, tmp){
			if(!in_use(s) && (oldest == NULL || s->used_ms < oldest->used_ms)) oldest = s;
		}
		if(oldest == NULL) return NULL;
		seen_free(oldest);
	}
	s = calloc(1, sizeof(*s));
	if(s == NULL) return NULL;
	s->id = xstrdup(id);
	if(s->id == NULL){
		free(s);
		return NULL;
	}
	s->used_ms = mono_ms();
	HASH_ADD_KEYPTR(hh, seen_by_id, s->id, strlen(s->id), s);
	n_seen++;
	return s;
}

bool linkin_auth(struct mosquitto *conn, const char *id, const char *username,
		const char *password)
{
	struct live *l;
	uint64_t held;

	if(!streq(username, LINK_USERNAME) || !secret_equal(password, secret)){
		st.refused++;
		if(ratelog_due(&refused_log, 10000, &held)){
			mosquitto_log_printf(MOSQ_LOG_WARNING, "mqfed: refused link '%s': %s (%llu more "
					"held back)", id, secret ? "wrong username or link secret (check the "
					"cluster's peer token on both nodes)" : "this node accepts no links "
					"(plugin_opt_link_secret is not set)", (unsigned long long)held);
		}
		return false;
	}
	HASH_FIND_PTR(lives, &conn, l);
	if(l == NULL){
		l = calloc(1, sizeof(*l));
		if(l == NULL) return false;
		l->conn = conn;
		HASH_ADD_PTR(lives, conn, l);
		st.connected++;
	}
	l->seen = seen_for(id);
	if(l->seen == NULL){
		linkin_disconnected(conn);
		return false;
	}
	return true;
}

static struct live *live_of(const struct mosquitto *conn)
{
	struct live *l = NULL;

	if(conn == NULL || lives == NULL) return NULL;
	HASH_FIND_PTR(lives, &conn, l);
	return l;
}

bool linkin_conn(const struct mosquitto *conn)
{
	return live_of(conn) != NULL;
}

void linkin_disconnected(const struct mosquitto *conn)
{
	struct live *l = live_of(conn);

	if(l == NULL) return;
	if(l->seen) l->seen->used_ms = mono_ms();
	HASH_DEL(lives, l);
	free(l);
	st.connected--;
}

bool linkin_fresh(const struct mosquitto *conn, uint64_t seq)
{
	struct live *l = live_of(conn);

	return l == NULL || seq > l->seen->last_seq;
}

void linkin_injected(const struct mosquitto *conn, uint64_t seq, uint64_t duplicates)
{
	struct live *l = live_of(conn);

	if(l == NULL) return;
	if(seq > l->seen->last_seq) l->seen->last_seq = seq;
	l->seen->used_ms = mono_ms();
	st.batches++;
	st.duplicates += duplicates;
}

void linkin_tick(void)
{
	struct seen *s, *tmp;
	int64_t now;

	if(n_seen == 0) return;
	now = mono_ms();
	if(now - last_sweep_ms < SWEEP_MS) return;
	last_sweep_ms = now;
	HASH_ITER(hh, seen_by_id, s, tmp){
		if(now - s->used_ms >= FORGET_MS && !in_use(s)) seen_free(s);
	}
}

void linkin_stats(struct linkin_stats *s)
{
	*s = st;
}

void linkin_cleanup(void)
{
	struct seen *s, *tmp;
	struct live *l, *ltmp;

	HASH_ITER(hh, lives, l, ltmp){
		HASH_DEL(lives, l);
		free(l);
	}
	HASH_ITER(hh, seen_by_id, s, tmp) seen_free(s);
	free(secret);
	secret = NULL;
	memset(&st, 0, sizeof(st));
	memset(&refused_log, 0, sizeof(refused_log));
	last_sweep_ms = 0;
}
