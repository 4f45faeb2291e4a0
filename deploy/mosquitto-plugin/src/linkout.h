/* Links out (linkout.c): the plugin's own MQTT connections to its peers' Mosquittos, which
 * carry captured records as MQFB batches, written from Mosquitto's thread at the TICK
 * (issue 25, slice 3). */
#ifndef MQFED_LINKOUT_H
#define MQFED_LINKOUT_H

#include "linkin.h"

struct linkout_stats {
	unsigned links;
	unsigned up;
	uint64_t records;          /* records taken, summed over links */
	uint64_t batches;          /* batches sealed */
	uint64_t acked;            /* batches PUBACKed */
	uint64_t resent;           /* batches written again on a new connection */
	uint64_t refused;          /* records no link took for want of room */
	uint64_t abandoned;        /* records of links removed before they were acknowledged */
	uint64_t connects;         /* connections that got a CONNACK 0 */
	uint64_t failures;         /* connection attempts or connections that failed */
	uint64_t held_bytes;       /* bytes of records not acknowledged yet */
};

/* `links`: the whole set ({"node", "links": [{peer, host, port, username, password}]}).
 * NULL, or an error code; *why says more. */
const char *linkout_configure(const cJSON *req, const char **why);
/* `link_filters`: {"peer", "add": [...], "remove": [...]} for that link's trie. */
const char *linkout_filters(const cJSON *req, const char **why);
/* Whether any link exists (then capture offers records to links first). */
bool linkout_active(void);
/* Offer a message's record: it goes to every link whose filters match `topic` (all of them
 * or none: one with no room refuses it for all), under the links' own seq (one per node, from
 * 1 at each load of the plugin) and the hlc now. True when links took it. */
bool linkout_take(uint8_t qos, bool retain, const char *topic,
		const char *client, size_t client_len, const uint8_t *props, uint32_t props_len,
		const void *payload, uint32_t payload_len);
/* The end of a loop iteration: connect, seal batches, write, read PUBACKs. */
void linkout_tick(void);
void linkout_stats(struct linkout_stats *s);
cJSON *linkout_links_json(void);
void linkout_cleanup(void);

#endif
