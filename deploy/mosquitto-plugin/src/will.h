/* A client's will, read from Mosquitto's internal client structure (will.c). */
#ifndef MQFED_WILL_H
#define MQFED_WILL_H

#include "util.h"

void will_add_json(cJSON *o, struct mosquitto *client);
void will_add_fate(cJSON *o, struct mosquitto *client);
uint16_t *client_last_mid(struct mosquitto *client);
bool client_in_packet(struct mosquitto *client, const uint8_t **body, uint32_t *len,
		uint8_t *command);
void will_cleanup(void);

#endif
