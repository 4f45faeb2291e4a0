/* Subscription options read from Mosquitto's subscription tree (subopts.c). */
#ifndef MQFED_SUBOPTS_H
#define MQFED_SUBOPTS_H

#include "util.h"

void subopts_note(struct mosquitto *client, const char *filter, uint8_t qos);
void subopts_tick(void);
void subopts_cleanup(void);

#endif
