/* Who the sidecar is: its client id, that of its forwarding connection `<sidecar_id>.fwd`, and
 * the live authenticated connection of each. Kept apart so every module can ask without
 * depending on plugin.c, which sets them. */
#include <stdlib.h>
#include <string.h>

#include "sidecar.h"

#define FWD_SUFFIX ".fwd"

static char *id_main;
static char *id_fwd;
static struct mosquitto *conn_main;
/* the forwarding connection (hot path; trusted, never reported) */
static struct mosquitto *conn_fwd;

int sidecar_init(const char *id)
{
	id_main = strdup(id);
	if(id_main == NULL) return -1;
	id_fwd = malloc(strlen(id_main) + sizeof(FWD_SUFFIX));
	if(id_fwd == NULL) return -1;
	strcpy(id_fwd, id_main);
	strcat(id_fwd, FWD_SUFFIX);
	return 0;
}

void sidecar_cleanup(void)
{
	free(id_main);
	free(id_fwd);
	id_main = NULL;
	id_fwd = NULL;
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
 * the secret). */
bool is_sidecar_id(const char *id)
{
	return id != NULL && (streq(id, id_main) || streq(id, id_fwd));
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
