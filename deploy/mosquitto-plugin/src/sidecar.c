/* Who the sidecar is: its client id, that of its forwarding connection `<sidecar_id>.fwd`
 * (which also re-injects peers' messages) and of its forwarding shards `<sidecar_id>.fwd<k>`
 * (k = 1 .. FWD_SHARDS_MAX - 1: more connections holding forwarding subscriptions, because
 * Mosquitto's cost per subscription grows with the subscriptions one client holds), the live
 * authenticated connection of the first two, and every connection that proved the sidecar's
 * identity (those, the shards and its shadows: the secret, on the private unix-socket
 * listener). Kept apart so every module can ask without depending on plugin.c, which sets
 * them. */
#include <stdlib.h>
#include <string.h>

#include "sidecar.h"

#define FWD_SUFFIX ".fwd"
/* Client ids beginning with this are the sidecar's (its default id, and the ids `mqfed node`
 * derives from the node's secret); the sidecar ignores such clients in its session handling. */
#define RESERVED_ID_PREFIX "mqfed-sidecar"

/* A connection that proved the sidecar's identity, until its DISCONNECT. */
struct vouched {
	UT_hash_handle hh;         /* keyed by conn (the pointer) */
	struct mosquitto *conn;
};

static char *id_main;
static char *id_fwd;
static char *socket_path;      /* the private listener's path; NULL: any unix socket */
static struct mosquitto *conn_main;
/* the forwarding connection (hot path; trusted, never reported) */
static struct mosquitto *conn_fwd;
static struct vouched *vouched;

int sidecar_init(const char *id, const char *private_socket)
{
	id_main = strdup(id);
	if(id_main == NULL) return -1;
	id_fwd = malloc(strlen(id_main) + sizeof(FWD_SUFFIX));
	if(id_fwd == NULL) return -1;
	strcpy(id_fwd, id_main);
	strcat(id_fwd, FWD_SUFFIX);
	if(private_socket != NULL && private_socket[0] != '\0'){
		socket_path = strdup(private_socket);
		if(socket_path == NULL) return -1;
	}
	return 0;
}

void sidecar_cleanup(void)
{
	struct vouched *v, *tmp;

	HASH_ITER(hh, vouched, v, tmp){
		HASH_DEL(vouched, v);
		free(v);
	}
	free(id_main);
	free(id_fwd);
	free(socket_path);
	id_main = NULL;
	id_fwd = NULL;
	socket_path = NULL;
	conn_main = NULL;
	conn_fwd = NULL;
}

const char *sidecar_id(void)
{
	return id_main;
}

const char *sidecar_fwd_id(void)
{
	return id_fwd;
}

/* Which forwarding connection `id` names: 0 for `<sidecar_id>.fwd`, k for `<sidecar_id>.fwd<k>`
 * (1 <= k < FWD_SHARDS_MAX, decimal without leading zero), -1 for any other id. */
int sidecar_fwd_shard(const char *id)
{
	size_t n;
	int k = 0;

	if(id == NULL || id_fwd == NULL) return -1;
	n = strlen(id_fwd);
	if(strncmp(id, id_fwd, n) != 0) return -1;
	id += n;
	if(*id == '\0') return 0;
	if(*id < '1' || *id > '9') return -1;
	for(; *id; id++){
		if(*id < '0' || *id > '9') return -1;
		k = k * 10 + (*id - '0');
		if(k >= FWD_SHARDS_MAX) return -1;
	}
	return k;
}

/* A forwarding connection (`.fwd` or a shard), live or its offline session (by its id). */
bool sidecar_is_fwd(struct mosquitto *client)
{
	return client != NULL && (client == conn_fwd
			|| sidecar_fwd_shard(mosquitto_client_id(client)) >= 0);
}

/* The sidecar's client ids: no other connection can get them (plugin.c refuses them without
 * the secret on the private listener, and denies every ACL check of one that got them where
 * Mosquitto asks no plugin: a TLS identity or PSK listener). */
bool is_sidecar_id(const char *id)
{
	return id != NULL && (streq(id, id_main) || sidecar_fwd_shard(id) >= 0);
}

/* A client id no client but the sidecar may use: its own, and any beginning with
 * "mqfed-sidecar". */
bool is_reserved_id(const char *id)
{
	return is_sidecar_id(id)
		|| (id != NULL && strncmp(id, RESERVED_ID_PREFIX, strlen(RESERVED_ID_PREFIX)) == 0);
}

/* Whether the connection came in on the private unix-socket listener. For a unix socket
 * Mosquitto's client address is the listener's path (net__socket_get_address, getsockname);
 * for TCP and websockets it is an IP address, never starting with '/'. */
bool sidecar_private(struct mosquitto *client)
{
	const char *address = mosquitto_client_address(client);

	if(address == NULL || address[0] != '/') return false;
	return socket_path == NULL || streq(address, socket_path);
}

const char *sidecar_socket(void)
{
	return socket_path;
}

void sidecar_vouch(struct mosquitto *conn)
{
	struct vouched *v;

	HASH_FIND_PTR(vouched, &conn, v);
	if(v != NULL) return;
	v = calloc(1, sizeof(*v));
	if(v == NULL) return; /* fails closed: the connection is then treated as an impostor */
	v->conn = conn;
	HASH_ADD_PTR(vouched, conn, v);
}

void sidecar_unvouch(struct mosquitto *conn)
{
	struct vouched *v;

	HASH_FIND_PTR(vouched, &conn, v);
	if(v == NULL) return;
	HASH_DEL(vouched, v);
	free(v);
}

bool sidecar_vouched(struct mosquitto *conn)
{
	struct vouched *v;

	if(conn == NULL) return false;
	HASH_FIND_PTR(vouched, &conn, v);
	return v != NULL;
}

struct mosquitto *sidecar_conn(void)
{
	return conn_main;
}

struct mosquitto *sidecar_fwd_conn(void)
{
	return conn_fwd;
}

void sidecar_set_conn(struct mosquitto *conn)
{
	conn_main = conn;
}

void sidecar_set_fwd_conn(struct mosquitto *conn)
{
	conn_fwd = conn;
}
