/* Who the sidecar is: its two client ids, their live connections, and the connections that
 * proved its identity (sidecar.c). */
#ifndef MQFED_SIDECAR_H
#define MQFED_SIDECAR_H

#include "util.h"

int sidecar_init(const char *id, const char *private_socket);
void sidecar_cleanup(void);
const char *sidecar_id(void);
const char *sidecar_fwd_id(void);
bool is_sidecar_id(const char *id);
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
