/* Who the sidecar is: its client id, that of its forwarding connection `<sidecar_id>.fwd`, the
 * live authenticated connection of each, and every connection that proved the sidecar's
 * identity (those two and its shadows: the secret, on the private unix-socket listener). Kept
 * apart so every module can ask without depending on plugin.c, which sets them. */
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

/* The sidecar's client ids: no other connection can get them (plugin.c refuses them without
 * the secret on the private listener, and denies every ACL check of one that got them where
 * Mosquitto asks no plugin: a TLS identity or PSK listener). */
bool is_sidecar_id(const char *id)
{
	return id != NULL && (streq(id, id_main) || streq(id, id_fwd));
}

/* A client id no client but the sidecar may use: its own two, and any beginning with
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
