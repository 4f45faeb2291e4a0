/* Overload shedding (shed.c). */
#ifndef MQFED_SHED_H
#define MQFED_SHED_H

#include "util.h"

struct shed_stats {
	unsigned filters;          /* the forwarding connection's */
	uint64_t since_report;
	uint64_t unread;
	uint64_t total;            /* publishers disconnected */
};

void shed_init(uint64_t backlog_max);
void shed_fwd_filter(const char *filter, bool subscribed);
void shed_fwd_routed(uint8_t qos);
void shed_report(uint64_t unacked, uint64_t taken, int64_t lease_ms);
void shed_fwd_connected(void);
void shed_capture_held(uint64_t records);
uint64_t shed_backlog(void);
bool shed_active(void);
bool shed_wanted(const char *topic);
bool shed_publish(struct mosquitto *client, const char *topic, uint8_t qos);
void shed_stats(struct shed_stats *s);
void shed_cleanup(void);

#endif
