/* Who the sidecar is: its client ids (control, forwarding and forwarding shards), their live
 * connections, and the connections that proved its identity (sidecar.c). */
#ifndef MQFED_SIDECAR_H
#define MQFED_SIDECAR_H

#include "util.h"

#define FWD_SHARDS_MAX 64 /* forwarding connections: `.fwd` and `.fwd1` .. `.fwd63` */

int sidecar_init(const char *id, const char *private_socket);
void sidecar_cleanup(void);
const char *sidecar_id(void);
const char *sidecar_fwd_id(void);
bool is_sidecar_id(const char *id);
int sidecar_fwd_shard(const char *id);
bool sidecar_is_fwd(struct mosquitto *client);
bool is_reserved_id(const char *id);
bool sidecar_private(struct mosquitto *client);
const char *sidecar_socket(void);
void sidecar_vouch(struct mosquitto *conn);
void sidecar_unvouch(struct mosquitto *conn);
bool sidecar_vouched(struct mosquitto *conn);
struct mosquitto *sidecar_conn(void);
struct mosquitto *sidecar_fwd_conn(void);
void sidecar_set_conn(struct mosquitto *conn);
void sidecar_set_fwd_conn(struct mosquitto *conn);

#endif
