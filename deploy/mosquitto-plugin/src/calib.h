/* Where Mosquitto keeps a client's session expiry interval (calib.c). */
#ifndef MQFED_CALIB_H
#define MQFED_CALIB_H

#include "util.h"

/* session expiry value meaning "not known" (v5 client and calibration not ok) */
#define EXPIRY_UNKNOWN (-1LL)
#define EXPIRY_NEVER ((int64_t)UINT32_MAX)

bool calib_on_sidecar_auth(struct mosquitto *client);
int64_t client_expiry(struct mosquitto *client);
bool calib_expiry_offset(size_t *offset);
const char *calib_name(void);
void calib_cleanup(void);

#endif
