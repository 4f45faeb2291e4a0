/* Commands from the sidecar and the deny list (commands.c). */
#ifndef MQFED_COMMANDS_H
#define MQFED_COMMANDS_H

#include "util.h"

void commands_init(unsigned snapshot_chunk, bool sessions_gate);
bool sessions_gate_closed(void);
/* A drain closed admission: refuse this connect (counted). */
bool admission_refuses(void);
void commands_on_control(const struct mosquitto_evt_control *ed);
bool deny_connect(const char *id, bool clean_start, bool *refuse);
void commands_cleanup(void);

#endif
