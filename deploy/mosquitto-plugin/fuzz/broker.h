/* A fake Mosquitto for the fuzz target (broker.c): the broker API the plugin calls, fake
 * client structures, and the plugin's registered callbacks. Single threaded, like Mosquitto. */
#ifndef MQFED_FUZZ_BROKER_H
#define MQFED_FUZZ_BROKER_H

#include <stdbool.h>
#include <stdint.h>

#include <mosquitto.h>
#include <mosquitto_broker.h>
#include <mosquitto_plugin.h>
#include <mqtt_protocol.h>

#define FAKE_SOCKET "/run/mqfed/mosquitto.sock"
#define FAKE_CS_NEW 0          /* enum mosquitto_client_state (lib/mosquitto_internal.h) */
#define FAKE_CS_DISCONNECTING 2
#define FAKE_CS_ACTIVE 3
#define FAKE_CS_DISCONNECTED 7
#define FAKE_CS_DUPLICATE 17

/* What the plugin may read of a client through the public accessors, and a field the
 * session-expiry calibration finds by scanning the allocation (calib.c). */
struct mosquitto {
	char *id;
	char *username;
	char *address;             /* FAKE_SOCKET, another path, an IP address or NULL */
	int protocol_version;      /* 3, 4 or 5 */
	int keepalive;
	int state;
	int sub_count;
	bool clean_start;
	bool doomed;               /* freed at the next tick (Mosquitto's disused list) */
	uint32_t padding[6];
	uint32_t session_expiry_interval;
	struct mosquitto *next;    /* every fake client, until the case ends */
};

void broker_reset(void);
struct mosquitto *broker_new_client(const char *id, const char *username, const char *address,
		int protocol_version, bool clean_start, uint32_t expiry);
struct mosquitto *broker_find_live(const char *id);
void broker_disconnect(struct mosquitto *c, bool keep_session);
void broker_free_doomed(void);
void broker_free_all(void);
int broker_call(int event, void *event_data);
bool broker_has_callback(int event);
void broker_set_later_verdict(int rc);

#endif
