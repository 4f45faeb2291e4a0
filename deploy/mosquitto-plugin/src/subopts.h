/* Subscription options read from Mosquitto's subscription tree (subopts.c). */
#ifndef MQFED_SUBOPTS_H
#define MQFED_SUBOPTS_H

#include "util.h"

void subopts_note(struct mosquitto *client, const char *filter, uint8_t qos);
const char *subopts_set(const char *id, const char *filter, uint8_t options);
void subopts_tick(void);
void subopts_cleanup(void);

#endif
