/* Who the sidecar is: its two client ids and their live connections (sidecar.c). */
#ifndef MQFED_SIDECAR_H
#define MQFED_SIDECAR_H

#include "util.h"

int sidecar_init(const char *id);
void sidecar_cleanup(void);
const char *sidecar_id(void);
const char *sidecar_fwd_id(void);
bool is_sidecar_id(const char *id);
struct mosquitto *sidecar_conn(void);
struct mosquitto *sidecar_fwd_conn(void);
void sidecar_set_conn(struct mosquitto *conn);
void sidecar_set_fwd_conn(struct mosquitto *conn);

#endif
