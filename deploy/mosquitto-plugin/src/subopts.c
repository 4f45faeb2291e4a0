/* Subscription options (No Local, Retain As Published, subscription identifier) of MQTT v5
 * clients, read from Mosquitto's subscription tree.
 *
 * The 2.0.11 plugin API shows a SUBSCRIBE only as an ACL check, before the subscription is
 * added and without its options. So the check notes (client, filter, granted QoS), and at the
 * end of the loop iteration (the tick), when Mosquitto has added it, the options are read from
 * the tree and reported (model_sub_options: a subscribe event with `options` and
 * `subscription_id` when they differ from what was reported). The cluster needs them to make
 * a moving session's subscriptions exactly as they were.
 *
 * The tree is Mosquitto's own (`db.normal_subs`, src/subs.c): one `struct mosquitto__subhier`
 * per topic level, keyed by the level in a uthash table (a leading "" level for topics that do
 * not start with '$'), each with a list of `struct mosquitto__subleaf` (context, identifier,
 * qos, no_local, retain_as_published). The mirrors below follow Debian's 2.0.11 headers
 * (src/mosquitto_broker_internal.h, which the CVE backport does not change). A leaf is trusted
 * only if its QoS is the granted one; any mismatch turns the reading off for the run (one
 * warning): the options are then reported as unknown, as before. A shared subscription
 * `$share/<group>/<filter>` is filed the same way in `db.shared_subs` by <filter>, its node then
 * holding one `struct mosquitto__subshared` per group with its own leaf list: read the same way
 * (No Local is a protocol error there, so only Retain As Published and the identifier). */
#include <stdlib.h>
#include <string.h>

#include "model.h"
#include "subopts.h"

#define PENDING_MAX 4096   /* notes kept per loop iteration; more are not read */
#define LEVELS_MAX 256

struct leaf_mirror {       /* struct mosquitto__subleaf */
	struct leaf_mirror *prev;
	struct leaf_mirror *next;
	struct mosquitto *context;
	uint32_t identifier;
	uint8_t qos;
	bool no_local;
	bool retain_as_published;
};

struct shared_mirror {     /* struct mosquitto__subshared */
	UT_hash_handle hh;
	char *name;
	struct leaf_mirror *subs;
};

struct hier_mirror {       /* struct mosquitto__subhier */
	UT_hash_handle hh;
	struct hier_mirror *parent;
	struct hier_mirror *children;
	struct leaf_mirror *subs;
	struct shared_mirror *shared;
	char *topic;
	uint16_t topic_len;
};

struct db_mirror {         /* the head of struct mosquitto_db */
	uint64_t last_db_id;
	struct hier_mirror *normal_subs;
	struct hier_mirror *shared_subs;
};

extern struct db_mirror db __attribute__((weak)); /* the broker's `db` (exported) */

struct note {
	struct mosquitto *client;
	char *filter;
	uint8_t qos;
};

static struct note pending[PENDING_MAX];
static unsigned n_pending;
static bool broken;

void subopts_note(struct mosquitto *client, const char *filter, uint8_t qos)
{
	if(broken || &db == NULL || n_pending == PENDING_MAX) return;
	if(mosquitto_client_protocol_version(client) != 5) return;
	pending[n_pending].filter = strdup(filter);
	if(pending[n_pending].filter == NULL) return;
	pending[n_pending].client = client;
	pending[n_pending].qos = qos;
	n_pending++;
}

/* The tree node of one topic level among `siblings` (NULL: none). */
static struct hier_mirror *level(struct hier_mirror *siblings, const char *name, size_t len)
{
	struct hier_mirror *h = NULL;

	if(siblings == NULL) return NULL;
	HASH_FIND(hh, siblings, name, len, h);
	if(h && (h->topic_len != len || memcmp(h->topic, name, len) != 0)) return NULL;
	return h;
}

/* The leaf of `client` (or, if `client` is NULL, of the session with client id `id`) for
 * `filter` (NULL: not subscribed). Mosquitto files a filter under
 * its first level's node, then again from that first level down among its children (sub__add,
 * sub__add_context): "a/b" is [""] -> "" -> "a" -> "b", "$SYS/x" is ["$SYS"] -> "$SYS" -> "x".
 * "$share/g/a/b" is "a/b" in the shared tree (always under the "" level, a "$" filter too:
 * sub__topic_tokenise), then group "g" at its last node. */
static struct leaf_mirror *find_leaf(struct mosquitto *client, const char *id,
		const char *filter)
{
	struct hier_mirror *root = db.normal_subs, *h;
	struct shared_mirror *group = NULL;
	const char *p, *slash, *name = NULL;
	size_t name_len = 0;
	struct leaf_mirror *l;
	unsigned depth = 0;

	if(strncmp(filter, "$share/", 7) == 0){
		name = filter + 7;
		slash = strchr(name, '/');
		if(slash == NULL || slash == name) return NULL;
		name_len = (size_t)(slash - name);
		filter = slash + 1;
		root = db.shared_subs;
	}
	p = filter;
	slash = strchr(filter, '/');
	if(filter[0] == '$' && name == NULL){ /* filed under its own first level */
		h = level(root, filter, slash ? (size_t)(slash - filter) : strlen(filter));
	}else{                /* under a leading "" level, twice */
		h = level(root, "", 0);
		h = h ? level(h->children, "", 0) : NULL;
	}
	while(p && h && depth++ < LEVELS_MAX){
		slash = strchr(p, '/');
		h = level(h->children, p, slash ? (size_t)(slash - p) : strlen(p));
		p = slash ? slash + 1 : NULL;
	}
	if(h == NULL || p != NULL) return NULL;
	if(name){
		if(h->shared) HASH_FIND(hh, h->shared, name, name_len, group);
		if(group == NULL || strlen(group->name) != name_len
				|| memcmp(group->name, name, name_len) != 0){
			return NULL;
		}
	}
	for(l = group ? group->subs : h->subs; l; l = l->next){
		if(client ? l->context == client
				: l->context && mosquitto_client_id(l->context)
					&& strcmp(mosquitto_client_id(l->context), id) == 0){
			return l;
		}
	}
	return NULL;
}

/* A leaf's No Local and Retain As Published, as bits of the subscription options byte. */
static uint8_t leaf_options(const struct leaf_mirror *l)
{
	return (uint8_t)((l->no_local ? 0x04 : 0) | (l->retain_as_published ? 0x08 : 0));
}

static void set_broken(void)
{
	broken = true;
	mosquitto_log_printf(MOSQ_LOG_WARNING, "mqfed: subscription options cannot be read from"
			" this Mosquitto (unexpected subscription tree); they are reported as unknown");
}

/* Give the subscription `filter` of client id `id` (online or an offline session) the No
 * Local and Retain As Published bits of `options` (the `sub_options` command), and report
 * them. Mosquitto 2.0.11 keeps a subscription's first two options when the same filter is
 * subscribed again (sub__add_leaf replaces only the QoS and the identifier), so a copy of a
 * session made before its client's options were known would keep them unset. Shared
 * subscriptions take Retain As Published only (No Local is a protocol error there). NULL, or
 * an error code. */
const char *subopts_set(const char *id, const char *filter, uint8_t options)
{
	struct client *c = model_find(id);
	struct leaf_mirror *l;
	bool shared = strncmp(filter, "$share/", 7) == 0;
	int qos;

	if(c == NULL) return "unknown_client";
	if((qos = model_sub_qos(c, filter)) < 0) return "not_subscribed";
	if(broken || &db == NULL) return "unreadable";
	l = find_leaf(NULL, id, filter);
	if(l == NULL) return "not_subscribed";
	if(l->qos != qos){
		set_broken();
		return "unreadable";
	}
	l->no_local = !shared && (options & 0x04);
	l->retain_as_published = (options & 0x08) != 0;
	model_sub_options(c, filter, leaf_options(l), l->identifier);
	return NULL;
}

void subopts_tick(void)
{
	unsigned i;
	struct leaf_mirror *l;
	struct client *c;

	for(i = 0; i < n_pending; i++){
		if(!broken){
			l = find_leaf(pending[i].client, NULL, pending[i].filter);
			if(l && l->qos != pending[i].qos){
				set_broken();
			}else if(l){
				c = model_find(mosquitto_client_id(l->context));
				if(c) model_sub_options(c, pending[i].filter, leaf_options(l), l->identifier);
			}
		}
		free(pending[i].filter);
	}
	n_pending = 0;
}

void subopts_cleanup(void)
{
	unsigned i;

	for(i = 0; i < n_pending; i++) free(pending[i].filter);
	n_pending = 0;
	broken = false;
}
