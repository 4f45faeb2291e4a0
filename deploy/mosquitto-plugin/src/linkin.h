/* Links in (linkin.c): connections of peers' plugins (linkout.c) that inject batches here, and
 * what each already injected (issue 25, slice 3). */
#ifndef MQFED_LINKIN_H
#define MQFED_LINKIN_H

#include "util.h"

#define LINK_ID_PREFIX "mqfed-sidecar-link."  /* a link's client id: reserved (sidecar.c) */
#define LINK_USERNAME "mqfed-link"

struct linkin_stats {
	unsigned connected;
	uint64_t batches;          /* batches injected from links */
	uint64_t duplicates;       /* records dropped: already injected (a batch sent again) */
	uint64_t refused;          /* connects refused (no link secret here, or a wrong one) */
};

/* The secret a link must present (plugin_opt_link_secret; NULL: links are refused). */
int linkin_init(const char *secret);
bool linkin_is_id(const char *id);
/* A connect with a link's client id: true when its credentials are right (then it is a link
 * until its disconnect); false: refuse it (logged). */
bool linkin_auth(struct mosquitto *conn, const char *id, const char *username,
		const char *password);
bool linkin_conn(const struct mosquitto *conn);
void linkin_disconnected(const struct mosquitto *conn);
/* Whether the record with this seq from link `conn` is new (records of one link come in seq
 * order; a batch written again after a reconnect repeats some). */
bool linkin_fresh(const struct mosquitto *conn, uint64_t seq);
/* The records up to `seq` of link `conn` are injected. */
void linkin_injected(const struct mosquitto *conn, uint64_t seq, uint64_t duplicates);
void linkin_tick(void);
void linkin_stats(struct linkin_stats *s);
void linkin_cleanup(void);

#endif
